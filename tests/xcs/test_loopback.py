"""The loopback OpenAI-compatible server, its stdlib client, and the official ``openai`` SDK
against it, alone and inside ``xcs.vmap`` / ``xcs.jit`` (the issue's real-client test)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from nablax.xcs.loopback import LoopbackHTTPError, LoopbackServer, chat, score

USER = "user"


@pytest.fixture
def server():
    with LoopbackServer(latency_s=0) as s:
        yield s


def _xcs():
    """``nablax.xcs`` with ``vmap`` and ``jit``, or skip (it is written alongside this file)."""
    xcs = pytest.importorskip("nablax.xcs")
    if not (hasattr(xcs, "vmap") and hasattr(xcs, "jit")):
        pytest.skip("nablax.xcs has no vmap/jit yet")
    return xcs


def _client(server, **kw):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url, api_key="test", **kw)


def _content(client, prompt: str) -> str:
    r = client.chat.completions.create(
        model="loopback", messages=[{"role": USER, "content": prompt}]
    )
    return r.choices[0].message.content


# ---- the server with the stdlib client -------------------------------------------------------


def test_stdlib_chat_and_score(server):
    assert server.url == f"http://127.0.0.1:{server.port}/v1"
    assert chat(server.url, "hello") == "echo: hello"
    assert chat(server.url + "/", "x", model="m2") == "echo: x"  # trailing slash is fine
    s1, s2 = score(server.url, "abc"), score(server.url, "abd")
    assert 0.0 <= s1 < 1.0 and s1 == score(server.url, "abc") and s1 != s2
    assert server.requests == 5
    assert [r.path for r in server.log] == ["/v1/chat/completions"] * 2 + ["/v1/score"] * 3


def test_models_endpoint(server):
    with urllib.request.urlopen(server.url + "/models", timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["object"] == "list" and body["data"][0]["id"] == "loopback"


def test_custom_responder():
    def responder(messages, model):
        return f"{model}:{len(messages)}:{messages[-1]['content'][::-1]}"

    with LoopbackServer(latency_s=0, responder=responder) as s:
        assert chat(s.url, "abc", model="m") == "m:1:cba"


def test_failing_responder_is_a_500(server):
    server.responder = lambda messages, model: 1 / 0
    with pytest.raises(LoopbackHTTPError) as e:
        chat(server.url, "x")
    assert e.value.status == 500 and "ZeroDivisionError" in e.value.body


def test_injected_errors_in_arrival_order():
    with LoopbackServer(latency_s=0, errors=[None, 500, None, 429]) as s:
        s.fail_next(1, status=503)  # queued failures come before the `errors` entries
        got = []
        for _ in range(6):
            try:
                got.append(chat(s.url, "q"))
            except LoopbackHTTPError as e:
                got.append(e.status)
        assert got == [503, "echo: q", 500, "echo: q", 429, "echo: q"]
        assert [r.status for r in s.log] == [503, 200, 500, 200, 429, 200]


def test_error_answers_use_openai_format_and_retry_headers(server):
    server.fail_next(1, status=429)
    req = urllib.request.Request(server.url + "/score", data=b'{"text": "a"}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 429
    assert e.value.headers["Retry-After"] == "0" and e.value.headers["retry-after-ms"] == "1"
    err = json.loads(e.value.read())["error"]
    assert err["type"] == "rate_limit_error" and "injected" in err["message"]


def test_stdlib_errors_name_the_status_and_the_fix(server):
    server.fail_next(1, status=500)
    with pytest.raises(LoopbackHTTPError, match=r"chat: .* answered HTTP 500") as e:
        chat(server.url, "x")
    assert e.value.status == 500 and '"error"' in e.value.body
    with pytest.raises(LoopbackHTTPError, match="answered HTTP 404"):
        chat(server.url.removesuffix("/v1"), "x")  # base_url without /v1
    url = server.url
    server.stop()
    with pytest.raises(LoopbackHTTPError, match="could not reach .*start the server") as e:
        score(url, "x", timeout=5)
    assert e.value.status is None


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="latency_s must be"):
        LoopbackServer(latency_s=-1)
    with pytest.raises(ValueError, match="errors=.*400..599"):
        LoopbackServer(errors=[200])
    s = LoopbackServer()
    with pytest.raises(ValueError, match=r"fail_next\(status=...\)"):
        s.fail_next(1, status=302)
    with pytest.raises(RuntimeError, match="not running"):
        s.url  # noqa: B018


def test_latency_is_settable_and_requests_overlap(server):
    server.latency_s = 0.2
    barrier, out = threading.Barrier(8), [None] * 8

    def worker(i):
        barrier.wait()
        out[i] = chat(server.url, f"q{i}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    assert out == [f"echo: q{i}" for i in range(8)]
    # the overlap is read from the server's own count of requests in flight; the wall-clock
    # bound only says "not one after another" (1.6 s), with room for a loaded 2-core runner
    assert server.max_concurrency >= 6 and server.requests == 8
    assert 0.2 <= wall < 1.2, wall
    assert all(r.end - r.start >= 0.2 for r in server.log)
    server.reset_stats()
    assert (server.requests, server.max_concurrency, server.log) == (0, 0, [])


# ---- the official openai SDK ---------------------------------------------------------------------


def test_sdk_chat_completion_parses(server):
    client = _client(server, max_retries=0)
    r = client.chat.completions.create(
        model="gpt-test",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": USER, "content": "two words"},
        ],
    )
    assert r.choices[0].message.content == "echo: two words"
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "stop"
    assert r.model == "gpt-test" and r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens == 7
    assert [m.id for m in client.models.list().data] == ["loopback"]


@pytest.mark.parametrize("status", [429, 500])
def test_sdk_retries_injected_errors(server, status):
    client = _client(server, max_retries=2)
    server.fail_next(2, status=status)
    t0 = time.perf_counter()
    assert _content(client, "retry me") == "echo: retry me"
    assert time.perf_counter() - t0 < 1.0  # retry-after-ms: 1 makes the SDK retry at once
    assert server.requests == 3
    assert [r.status for r in server.log] == [status, status, 200]


def test_sdk_without_retries_raises(server):
    openai = pytest.importorskip("openai")
    client = _client(server, max_retries=0)
    server.fail_next(1, status=429)
    with pytest.raises(openai.RateLimitError) as e:
        _content(client, "x")
    assert e.value.status_code == 429 and "injected" in str(e.value)
    server.fail_next(1, status=500)
    with pytest.raises(openai.InternalServerError):
        _content(client, "x")
    with pytest.raises(openai.BadRequestError, match="stream=False only"):
        client.chat.completions.create(
            model="m", messages=[{"role": USER, "content": "x"}], stream=True
        )
    assert server.requests == 3


def test_async_sdk_gather_overlaps(server):
    openai = pytest.importorskip("openai")
    server.latency_s = 0.25

    async def run():
        async with openai.AsyncOpenAI(base_url=server.url, api_key="test") as client:

            async def one(i):
                r = await client.chat.completions.create(
                    model="loopback", messages=[{"role": USER, "content": f"q{i}"}]
                )
                return r.choices[0].message.content

            await one(-1)  # warm the connection pool and the SDK
            t0 = time.perf_counter()
            out = await asyncio.gather(*(one(i) for i in range(16)))
            return out, time.perf_counter() - t0

    out, wall = asyncio.run(run())
    assert out == [f"echo: q{i}" for i in range(16)]
    # overlap: the server saw at least 8 of the 16 requests in flight at once; the wall-clock
    # bound only rules out "one after another" (4 s), with room for a loaded runner
    assert server.max_concurrency >= 8
    assert wall < 16 * 0.25 / 2, wall


# ---- the SDK inside nablax.xcs ---------------------------------------------------------------


def test_sdk_inside_xcs_vmap(server):
    xcs = _xcs()
    client = _client(server, max_retries=2)
    server.latency_s = 0.05
    server.fail_next(1, status=500)

    def ask(prompt):
        r = client.chat.completions.create(
            model="loopback", messages=[{"role": USER, "content": prompt}]
        )
        return r.choices[0].message.content

    prompts = [f"prompt {i}" for i in range(64)]
    t0 = time.perf_counter()
    out = xcs.vmap(ask)(prompts)
    wall = time.perf_counter() - t0
    assert out == [f"echo: prompt {i}" for i in range(64)]
    assert server.requests == 65  # the injected 500 was retried by the SDK
    assert server.max_concurrency > 1
    assert wall < 64 * 0.05 / 2, wall  # concurrent, not one after another


def test_stdlib_chat_inside_xcs_vmap_broadcasts_the_url(server):
    xcs = _xcs()
    prompts = [f"p{i}" for i in range(20)]
    out = xcs.vmap(chat, in_axes=(None, 0))(server.url, prompts)
    assert out == [f"echo: p{i}" for i in range(20)]
    assert xcs.vmap(chat, in_axes=(None, 0))(server.url, []) == []


def test_sdk_chain_inside_xcs_jit(server):
    xcs = _xcs()
    client = _client(server, max_retries=2)
    server.latency_s = 0.05
    calls = []

    def ask(prompt):
        calls.append(prompt)
        r = client.chat.completions.create(
            model="loopback", messages=[{"role": USER, "content": prompt}]
        )
        return r.choices[0].message.content

    @xcs.jit
    def pipeline(q):
        a = ask(q)
        b = ask("refine: " + a)
        return b

    assert pipeline("what?") == "echo: refine: echo: what?"
    assert calls == ["what?", "refine: echo: what?"]  # each once, in order
    first, second = server.log
    assert second.start >= first.end  # the dependent call waited for the first
    plan = pipeline.last_plan()
    assert len(plan.nodes) == 2 and len(plan.edges) == 1
    calls.clear()
    server.fail_next(1, status=429)  # retried inside the SDK, invisible to the plan
    assert pipeline("again") == "echo: refine: echo: again"
    assert calls == ["again", "refine: echo: again"]
    assert server.requests == 5


def test_sdk_fan_out_inside_xcs_jit_overlaps(server):
    xcs = _xcs()
    client = _client(server, max_retries=0)
    server.latency_s = 0.2
    _content(client, "warm")  # the SDK's first request pays for its setup
    server.reset_stats()
    calls = []

    def ask(prompt):
        calls.append(prompt)
        return _content(client, prompt)

    @xcs.jit
    def fan(q):
        parts = [ask(f"{q} {i}") for i in range(8)]
        return [p.upper() for p in parts]

    t0 = time.perf_counter()
    out = fan("q")
    wall = time.perf_counter() - t0
    assert out == [f"ECHO: Q {i}" for i in range(8)]
    assert sorted(calls) == [f"q {i}" for i in range(8)]
    assert wall < 5 * 0.2, wall  # one after another: 1.6 s
    assert server.max_concurrency >= 4 and fan.stats().calls == 8


def test_stdlib_chat_inside_xcs_jit_overlaps(server):
    xcs = _xcs()
    assert xcs.classify(chat).kind == "orchestration"
    server.latency_s = 0.1
    url = server.url

    def ask(prompt):  # a user's helper around the stdlib client: orchestration too
        return chat(url, prompt)

    @xcs.jit
    def fan(q):
        return [ask(f"{q} {i}") for i in range(6)]

    t0 = time.perf_counter()
    assert fan("q") == [f"echo: q {i}" for i in range(6)]
    assert time.perf_counter() - t0 < 4.5 * 0.1  # one after another: 0.6 s
    assert fan.stats().calls == 6 and server.max_concurrency >= 3


# ---- hardening: client errors are answered, never crash or print ---------------------------------


def _raw(server, request: bytes, timeout: float = 5.0) -> bytes:
    import socket

    with socket.create_connection((server.host, server.port), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while True:
            try:
                data = s.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            chunks.append(data)
            if b"\r\n\r\n" in b"".join(chunks):
                head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
                n = int(
                    next(
                        (
                            ln.split(b":")[1]
                            for ln in head.split(b"\r\n")
                            if ln.lower().startswith(b"content-length")
                        ),
                        b"0",
                    )
                )
                if len(body) >= n:
                    break
        return b"".join(chunks)


def _post(path: str, body: bytes, length: str | None = None) -> bytes:
    n = str(len(body)) if length is None else length
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {n}\r\n\r\n"
    ).encode() + body


@pytest.mark.parametrize(
    "request_bytes, status, words",
    [
        (_post("/v1/chat/completions", b"{}", length="abc"), 400, "not an integer"),
        (_post("/v1/chat/completions", b"", length="-5"), 400, "negative"),
        (_post("/v1/chat/completions", b'{"messages": ["hi"]}'), 400, "messages[0]"),
        (_post("/v1/chat/completions", b'{"messages": [{"content": "x"}]}'), 400, "role"),
        (_post("/v1/chat/completions", b"[1, 2]"), 400, "JSON object"),
        (_post("/v1/chat/completions", b"x" * 10, length=str(2 << 20)), 413, "over the limit"),
    ],
)
def test_client_errors_are_answered_without_tracebacks(capfd, request_bytes, status, words):
    with LoopbackServer(latency_s=0, max_body_bytes=1 << 20) as server:
        answer = _raw(server, request_bytes)
        assert answer.startswith(f"HTTP/1.1 {status}".encode()), answer[:200]
        assert words.encode() in answer
        assert chat(server.url, "still fine") == "echo: still fine"
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


def test_a_silent_client_is_timed_out(capfd):
    import socket
    import time

    with LoopbackServer(latency_s=0, socket_timeout_s=0.3) as server:
        with socket.create_connection((server.host, server.port)) as s:
            s.sendall(_post("/v1/chat/completions", b"", length="100"))  # promises 100 bytes
            t = time.perf_counter()
            s.settimeout(5.0)
            assert s.recv(100) == b""  # the server closed the connection
            assert time.perf_counter() - t < 3.0
        assert chat(server.url, "next") == "echo: next"
    assert "Traceback" not in capfd.readouterr().err
