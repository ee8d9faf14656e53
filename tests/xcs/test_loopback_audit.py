"""Issue 35 item 18: a deeply nested JSON request body is a client error (400 in OpenAI's error
format), never a dropped connection; the server keeps serving afterwards."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from nablax.xcs.loopback import LoopbackServer, score


@pytest.fixture
def server():
    with LoopbackServer(latency_s=0) as s:
        yield s


def _post(server, path: str, data: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + path, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize(
    "path, body",
    [
        ("/score", b"[" * 200_000 + b"]" * 200_000),  # past the JSON decoder's recursion
        ("/score", b'{"text": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
        (  # parses, but deep enough to make a handler's repr() or the reply recurse
            "/chat/completions",
            b'{"messages": [' + b"[" * 900 + b"]" * 900 + b"]}",
        ),
        (
            "/chat/completions",
            b'{"messages": [{"role": "user", "content": '
            + b'{"a": ' * 900
            + b"1"
            + b"}" * 900
            + b"}]}",
        ),
    ],
    ids=["array", "in-object", "message", "content"],
)
def test_a_deeply_nested_body_is_answered_400(server, path, body):
    status, payload = _post(server, path, body)
    assert status == 400, payload
    assert payload["error"]["type"] == "invalid_request_error"
    assert "nested more than" in payload["error"]["message"]
    assert server.log[-1].status == 400
    assert 0.0 <= score(server.url, "still serving") <= 1.0  # the next request is served


def test_moderate_nesting_is_still_accepted(server):
    content = {"a": {"b": [[{"c": "d"}]]}}
    body = json.dumps({"messages": [{"role": "user", "content": content}]}).encode()
    status, payload = _post(server, "/chat/completions", body)
    assert status == 200, payload
