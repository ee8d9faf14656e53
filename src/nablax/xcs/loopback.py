"""A local OpenAI-compatible HTTP server for tests, demos and benchmarks (standard library only).

:class:`LoopbackServer` answers ``POST /v1/chat/completions`` in the OpenAI chat-completions format
(so the official ``openai`` SDK parses it), ``GET /v1/models`` and a small ``POST /v1/score``
endpoint, after a configurable latency, with injectable HTTP errors and thread-safe statistics.
:func:`chat` and :func:`score` are tiny ``urllib`` clients for code that does not use the SDK.

>>> with LoopbackServer(latency_s=0) as server:
...     chat(server.url, "hello")
'echo: hello'

With the SDK (``pip install openai``)::

    client = openai.OpenAI(base_url=server.url, api_key="test")
    client.chat.completions.create(model="loopback", messages=[{"role": "user", "content": "hi"}])
"""

from __future__ import annotations

import collections
import hashlib
import http.server
import itertools
import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from nablax.errors import NablaxError

from .markers import mark_orchestration

__all__ = ["LoopbackServer", "LoopbackHTTPError", "RequestRecord", "chat", "score"]

_LOG_LIMIT = 100_000  # the request log is bounded; older records are dropped first

# OpenAI's error ``type`` for each status the server may answer with.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class LoopbackHTTPError(NablaxError, RuntimeError):
    """An HTTP request of :func:`chat` / :func:`score` failed; ``status`` is None when unreachable.

    >>> LoopbackHTTPError("chat", "http://x/v1", 429, "{}").status
    429
    """

    def __init__(self, api: str, url: str, status: int | None, body: str) -> None:
        self.api, self.url, self.status, self.body = api, url, status, body
        if status is None:
            msg = (
                f"nablax.xcs.loopback.{api}: could not reach {url}: {body}. Fix: start the "
                "server first (LoopbackServer.start() or `with LoopbackServer() as s:`) and pass "
                "its `url` as base_url"
            )
        else:
            msg = (
                f"nablax.xcs.loopback.{api}: {url} answered HTTP {status}: {body[:500]}. Fix: "
                "retry on 429/5xx, or check the request (base_url must end in /v1)"
            )
        super().__init__(msg)


class RequestRecord(NamedTuple):
    """One served request: path, ``time.perf_counter()`` start and end, HTTP status."""

    path: str
    start: float
    end: float
    status: int


def _default_responder(messages: list, model: str) -> str:
    """``"echo: "`` plus the text of the last user message."""
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return "echo: " + _text_of(m.get("content"))
    return "echo: "


def _text_of(content: Any) -> str:
    # Content is a string or a list of parts ({"type": "text", "text": ...}) in the OpenAI format.
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _score_of(text: str) -> float:
    """A deterministic score in [0, 1) from the SHA-256 of the text, rounded to 6 decimals."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return round(int.from_bytes(digest[:8], "big") / 2.0**64, 6)


def _check_status(api: str, status: Any) -> int:
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
        raise ValueError(
            f"LoopbackServer.{api}: status must be an HTTP error code in 400..599 (or None for "
            f"success), got {status!r}. Fix: pass e.g. 429 or 500"
        )
    return status


class LoopbackServer:
    """An OpenAI-compatible HTTP server on ``host:port`` (``port=0``: a free port) for tests.

    Args:
        latency_s: seconds each chat / score request sleeps before answering (settable later:
            ``server.latency_s = 0.05``). Injected errors answer at once, as a rate limiter does.
        host, port: where to listen.
        responder: ``responder(messages, model) -> str`` gives the assistant's content; the
            default answers ``"echo: " + <last user message>``.
        errors: HTTP status codes (or None = success) consumed one per request, in arrival order
            (a list or any iterator, e.g. ``itertools.cycle([None, 500])``); failures queued by
            :meth:`fail_next` come first.
        retry_after_ms: the ``retry-after-ms`` header of error answers (``Retry-After: 0`` is
            sent too), so SDK retries wait only this long.
        max_body_bytes: larger request bodies are answered 413 without being read.
        socket_timeout_s: a connection that sends nothing for this long is closed (a client
            that announces a body and never sends it cannot hold a handler thread forever).

    Client errors (a bad ``Content-Length``, a body that is not a JSON object or is nested more
    than 64 levels deep, a message that is not an object, a body over the limit) are answered 400 / 413 in OpenAI's error format; they
    never print tracebacks.

    Statistics (thread-safe): ``requests``, ``max_concurrency``, ``log`` (:class:`RequestRecord`).

    >>> with LoopbackServer(latency_s=0, errors=[429]) as server:
    ...     try:
    ...         chat(server.url, "hi")
    ...     except LoopbackHTTPError as e:
    ...         print(e.status)
    ...     print(chat(server.url, "hi"), server.requests, [r.status for r in server.log])
    429
    echo: hi 2 [429, 200]
    """

    def __init__(
        self,
        latency_s: float = 0.1,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        responder: Callable[[list, str], str] | None = None,
        errors: Iterable[int | None] | None = None,
        retry_after_ms: int = 1,
        max_body_bytes: int = 1 << 20,
        socket_timeout_s: float = 30.0,
    ) -> None:
        self.latency_s = latency_s
        if int(max_body_bytes) < 0 or not float(socket_timeout_s) > 0:
            raise ValueError(
                f"LoopbackServer: max_body_bytes must be >= 0 and socket_timeout_s > 0, got "
                f"{max_body_bytes!r} and {socket_timeout_s!r}"
            )
        self.max_body_bytes = int(max_body_bytes)
        self.socket_timeout_s = float(socket_timeout_s)
        self.host, self.port = host, port
        self.responder = responder if responder is not None else _default_responder
        if isinstance(errors, list | tuple):
            errors = [
                None if s is None else _check_status("__init__(errors=...)", s) for s in errors
            ]
        self._errors = iter(errors) if errors is not None else iter(())
        self._queued: collections.deque[int] = collections.deque()
        self.retry_after_ms = int(retry_after_ms)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.reset_stats()

    # -- configuration -------------------------------------------------------------------------

    @property
    def latency_s(self) -> float:
        """Seconds each chat / score request waits before answering."""
        return self._latency_s

    @latency_s.setter
    def latency_s(self, value: float) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
            raise ValueError(
                f"LoopbackServer(latency_s=...): latency_s must be a number of seconds >= 0, got "
                f"{value!r}. Fix: pass e.g. 0.1, or 0 for no delay"
            )
        self._latency_s = float(value)

    def fail_next(self, n: int = 1, status: int = 429) -> None:
        """Answer the next ``n`` requests with HTTP ``status`` (before any ``errors`` entries).

        >>> with LoopbackServer(latency_s=0) as server:
        ...     server.fail_next(1, status=500)
        ...     try:
        ...         score(server.url, "x")
        ...     except LoopbackHTTPError as e:
        ...         print(e.status)
        500
        """
        if not isinstance(n, int) or n < 0:
            raise ValueError(
                f"LoopbackServer.fail_next(n=...): n must be an int >= 0, got {n!r}. Fix: pass "
                "the number of requests that should fail"
            )
        _check_status("fail_next(status=...)", status)
        with self._lock:
            self._queued.extend([status] * n)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> LoopbackServer:
        """Listen and serve in a daemon thread; returns ``self``. Starting twice is an error."""
        if self._httpd is not None:
            raise RuntimeError(
                "LoopbackServer.start: the server is already running. Fix: call stop() first, or "
                "use a new LoopbackServer"
            )
        httpd = _HTTPServer((self.host, self.port), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"nablax-loopback-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the listening socket and open connections. Idempotent."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        httpd.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The ``base_url`` for clients: ``http://127.0.0.1:<port>/v1``."""
        if self._httpd is None:
            raise RuntimeError(
                "LoopbackServer.url: the server is not running, so it has no port yet. Fix: call "
                "start() or use `with LoopbackServer() as server:` first"
            )
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}/v1"

    # -- statistics ----------------------------------------------------------------------------

    def reset_stats(self) -> None:
        """Zero ``requests``, ``max_concurrency`` and the ``log`` (queued errors stay)."""
        with self._lock:
            self._requests = 0
            self._active = 0
            self._max_active = 0
            self._log: collections.deque[RequestRecord] = collections.deque(maxlen=_LOG_LIMIT)

    @property
    def requests(self) -> int:
        """How many HTTP requests arrived (failed ones and SDK retries included)."""
        with self._lock:
            return self._requests

    @property
    def max_concurrency(self) -> int:
        """The most requests that were being served at the same time."""
        with self._lock:
            return self._max_active

    @property
    def log(self) -> list[RequestRecord]:
        """The served requests, in the order they finished."""
        with self._lock:
            return list(self._log)

    # -- used by the handler threads -------------------------------------------------------------

    def _arrive(self) -> int | None:
        """Count a request and return its injected error status (None: answer normally)."""
        with self._lock:
            self._requests += 1
            self._active += 1
            self._max_active = max(self._max_active, self._active)
            if self._queued:
                return self._queued.popleft()
            status = next(self._errors, None)
        return None if status is None else _check_status("__init__(errors=...)", status)

    def _depart(self, path: str, start: float, status: int) -> None:
        with self._lock:
            self._active -= 1
            self._log.append(RequestRecord(path, start, time.perf_counter(), status))

    def _chat_completion(self, body: dict) -> dict:
        messages, model = body.get("messages"), body.get("model", "loopback")
        content = self.responder(messages, model)
        if not isinstance(content, str):
            raise TypeError(
                f"LoopbackServer(responder=...): the responder returned {type(content).__name__}, "
                "not str. Fix: return the assistant's text"
            )
        prompt_tokens = sum(len(_text_of(m.get("content")).split()) for m in messages)
        completion_tokens = len(content.split())
        return {
            "id": f"chatcmpl-loopback-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "system_fingerprint": None,
        }


_MAX_JSON_DEPTH = 64  # deeper request bodies are answered 400 (handlers recurse over them)


def _depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value (iterative: a deep value must not recurse)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            if d > _MAX_JSON_DEPTH:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _error_body(status: int, message: str, code: str | None = None) -> dict:
    """An error answer in OpenAI's JSON format."""
    etype = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": etype, "param": None, "code": code}}


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the default of 5 drops bursts of connects (1 s SYN retry)
    owner: LoopbackServer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that disconnects, times out or sends garbage is not the server's error: no
        traceback on stderr (socketserver prints one by default)."""
        err = sys.exc_info()[1]
        if isinstance(err, (OSError, ValueError, EOFError)):
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        # Keep-alive connections would otherwise hold their handler threads until the client goes.
        with self.connections_lock:
            conns = list(self.connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server: _HTTPServer

    def setup(self) -> None:
        self.timeout = (
            self.server.owner.socket_timeout_s
        )  # the socket's timeout (StreamRequestHandler)
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests and benchmarks read the statistics instead

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        owner, start = self.server.owner, time.perf_counter()
        path = self.path.split("?", 1)[0].rstrip("/")
        length = self._content_length(owner)
        if isinstance(length, tuple):  # a client error: answered without reading the body
            owner._depart(path, start, length[0])
            self.close_connection = True  # where its body ends is unknown: no keep-alive
            self._send(*length, retry=False)
            return
        raw = self.rfile.read(length)
        if len(raw) < length:  # the client went away (or timed out) mid-body
            self.close_connection = True
            return
        status, payload = 500, _error_body(500, "LoopbackServer: internal error")
        try:
            try:
                injected = owner._arrive()
            except ValueError as e:  # a bad entry in an `errors` iterator
                injected, msg = 500, str(e)
            else:
                msg = f"injected HTTP {injected} from LoopbackServer"
            if injected is not None:
                status, payload = injected, _error_body(injected, msg, "loopback_injected")
            else:
                status, payload = self._route(owner, method, path, raw)
        finally:
            # Recorded before the answer leaves, so a client that got it also sees it in the log.
            owner._depart(path, start, status)
        self._send(status, payload, retry=status == 429 or status >= 500)

    def _content_length(self, owner: LoopbackServer) -> int | tuple[int, dict]:
        """The body's length, or ``(status, error body)`` for a bad or too large one."""
        text = self.headers.get("Content-Length")
        if text is None:
            return 0
        try:
            n = int(text.strip())
        except ValueError:
            return 400, _error_body(400, f"bad Content-Length header {text!r}: not an integer")
        if n < 0:
            return 400, _error_body(400, f"bad Content-Length header {text!r}: negative")
        if n > owner.max_body_bytes:
            msg = f"request body of {n} bytes is over the limit of {owner.max_body_bytes} bytes"
            return 413, _error_body(413, msg, "request_too_large")
        return n

    def _route(self, owner: LoopbackServer, method: str, path: str, raw: bytes) -> tuple[int, dict]:
        routes = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/score"): self._score,
            ("GET", "/v1/models"): lambda o, b: (200, _models()),
        }
        handler = routes.get((method, path))
        if handler is None:
            return 404, _error_body(404, f"no route {method} {path} on LoopbackServer")
        try:
            body = json.loads(raw or b"{}") if method == "POST" else {}
        except ValueError as e:
            return 400, _error_body(400, f"request body is not valid JSON: {e}")
        except RecursionError:  # json's decoder recurses once per level
            body = None
        if body is None or _depth(body) > _MAX_JSON_DEPTH:
            msg = f"request body is nested more than {_MAX_JSON_DEPTH} levels deep"
            return 400, _error_body(400, msg, "invalid_value")
        if not isinstance(body, dict):
            return 400, _error_body(400, "request body must be a JSON object")
        try:
            return handler(owner, body)
        except Exception as e:  # a failing responder is the server's error, as in a real API
            return 500, _error_body(500, f"{type(e).__name__}: {e}")

    @staticmethod
    def _chat(owner: LoopbackServer, body: dict) -> tuple[int, dict]:
        if body.get("stream"):
            msg = "LoopbackServer supports stream=False only. Fix: call without stream=True"
            return 400, _error_body(400, msg, "unsupported_parameter")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return 400, _error_body(400, "'messages' must be a non-empty list", "invalid_value")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                msg = f"messages[{i}] must be an object with a string 'role', got {m!r:.80}"
                return 400, _error_body(400, msg, "invalid_value")
        time.sleep(owner.latency_s)
        return 200, owner._chat_completion(body)

    @staticmethod
    def _score(owner: LoopbackServer, body: dict) -> tuple[int, dict]:
        text = body.get("text")
        if not isinstance(text, str):
            return 400, _error_body(400, "'text' must be a string", "invalid_value")
        time.sleep(owner.latency_s)
        return 200, {"score": _score_of(text)}

    def _send(self, status: int, payload: dict, *, retry: bool) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry:
            self.send_header("Retry-After", "0")
            self.send_header("retry-after-ms", str(self.server.owner.retry_after_ms))
        self.end_headers()
        self.wfile.write(data)


def _models() -> dict:
    model = {"id": "loopback", "object": "model", "created": 0, "owned_by": "nablax"}
    return {"object": "list", "data": [model]}


# -- a tiny standard-library client ------------------------------------------------------------


# Marked because the classifier counts nablax.xcs itself as neutral library code; these do I/O.
@mark_orchestration
def chat(base_url: str, prompt: str, *, model: str = "loopback", timeout: float = 30) -> str:
    """Send ``prompt`` as one user message to ``<base_url>/chat/completions``; return the reply.

    Raises :class:`LoopbackHTTPError` (with ``status`` and ``body``) on an HTTP error.

    >>> with LoopbackServer(latency_s=0) as server:
    ...     chat(server.url, "What is 2 + 2?")
    'echo: What is 2 + 2?'
    """
    url = base_url.rstrip("/") + "/chat/completions"
    payload = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode("utf-8"),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    answer = _send_request("chat", req, timeout)
    return answer["choices"][0]["message"]["content"]


@mark_orchestration
def score(base_url: str, text: str, *, timeout: float = 30) -> float:
    """POST ``{"text": text}`` to ``<base_url>/score``; return its deterministic score in [0, 1).

    >>> with LoopbackServer(latency_s=0) as server:
    ...     s = score(server.url, "a fine sentence")
    ...     0.0 <= s < 1.0, s == score(server.url, "a fine sentence")
    (True, True)
    """
    req = urllib.request.Request(
        base_url.rstrip("/") + "/score",
        data=json.dumps({"text": text}).encode("utf-8"),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    return float(_send_request("score", req, timeout)["score"])


def _send_request(api: str, req: urllib.request.Request, timeout: float) -> dict:
    """Open ``req`` and decode its JSON answer; HTTP and connection errors become LoopbackHTTPError."""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        body = e.read().decode("utf-8", "replace")
        raise LoopbackHTTPError(api, req.full_url, e.code, body) from None
    except urllib.error.URLError as e:
        raise LoopbackHTTPError(api, req.full_url, None, str(e.reason)) from None
