"""A small local server that speaks the OpenAI chat-completions protocol, with faults on demand.

Use it as a fault injector for client tests or as a scripted engineer/solver that returns given replies::

    with FakeOpenAI() as srv:                       # srv.base_url == "http://127.0.0.1:<port>/v1"
        srv.script(Fault.rate_limit(retry_after=0.2), Fault.server_error(), "the reply")
        chat = OpenAIChat(srv.base_url, "fake-model", api_key="sk-...", backend="fake")
        chat.chat([{"role": "user", "content": "hi"}]).text   # -> "the reply", after two retries
        srv.requests    # every request: {"path", "query" (dict), "headers" (lower-case names), "body"}

Each request takes the next scripted item; once the script is spent, ``default`` answers (a string, a
:class:`Thinker`, or a function ``request_body -> str`` for a scripted engineer that looks at the prompt). Items
are a reply string, a :class:`Reply` (text plus token counts, a finish reason, a ``reasoning_content`` field), a
:class:`Thinker` (a reasoning model: its thinking counts against the request's token limit) or a :class:`Fault`:

- ``Fault.rate_limit(retry_after, headers=None)``: 429 with a ``Retry-After`` header (seconds), or the
  given headers instead (an HTTP-date ``Retry-After``, OpenAI's ``retry-after-ms``);
- ``Fault.server_error(status=500)``: a 5xx with an OpenAI-style error body;
- ``Fault.slow(delay_s, then="...")``: sleeps before answering (past the client's timeout);
- ``Fault.drop()``: closes the connection without answering;
- ``Fault.malformed()``: 200 with a body that is not valid JSON;
- ``Fault.status(code, message)``: any other status with an error message.

``reject_json_schema=True`` makes it answer ``reject_status`` (400) with ``reject_message`` to every request
carrying ``response_format`` of type ``json_schema``, like servers without structured output;
``reject_json_object=True`` does the same for type ``json_object`` (servers without JSON mode).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit


@dataclass
class Reply:
    text: str
    prompt_tokens: int = 11
    completion_tokens: int | None = None  # default: number of words in text
    finish_reason: str = "stop"
    reasoning_content: str | None = None  # sent beside the content, as vLLM's reasoning parsers and DeepSeek do


@dataclass
class Thinker:
    """Answers as a reasoning model does: it thinks `think_tokens` tokens (one word each) before its answer, and
    that thinking counts against the request's `max_tokens` / `max_completion_tokens`. Below thinking plus answer
    the reply is cut there (`finish_reason: length`): with `style="field"` (an API that returns the thinking
    apart, as `reasoning_content`) its content is empty; with `style="tags"` (a model served without a reasoning
    parser) the content is the thinking so far after an unclosed `<think>`. At or above it the content is the
    answer (after `<think>...</think>` with "tags"). `limits` records the limit of every request answered."""

    answer: str
    think_tokens: int = 1000
    style: str = "field"  # field | tags

    def __post_init__(self) -> None:
        self.limits: list[int | None] = []

    def reply(self, body: dict) -> Reply:
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        self.limits.append(limit)
        need = self.think_tokens + len(self.answer.split())
        thought = " ".join(f"step{i}" for i in range(min(self.think_tokens, limit or self.think_tokens)))
        if limit is not None and limit < need:
            if self.style == "tags":
                return Reply(f"<think>{thought}", completion_tokens=limit, finish_reason="length")
            return Reply("", completion_tokens=limit, finish_reason="length", reasoning_content=thought)
        if self.style == "tags":
            return Reply(f"<think>{thought}</think>\n{self.answer}", completion_tokens=need)
        return Reply(self.answer, completion_tokens=need, reasoning_content=thought)


@dataclass
class Fault:
    kind: str  # rate_limit | server_error | slow | drop | malformed | status
    status: int = 500
    retry_after: float | None = None
    delay_s: float = 0.0
    then: str = "late reply"
    message: str = "injected fault"
    headers: dict | None = None  # sent instead of the Retry-After built from retry_after

    @classmethod
    def rate_limit(cls, retry_after: float | None = 1.0, headers: dict | None = None) -> Fault:
        return cls("rate_limit", status=429, retry_after=retry_after, message="Rate limit reached", headers=headers)

    @classmethod
    def server_error(cls, status: int = 500) -> Fault:
        return cls("server_error", status=status, message="The server had an error")

    @classmethod
    def slow(cls, delay_s: float, then: str = "late reply") -> Fault:
        return cls("slow", delay_s=delay_s, then=then)

    @classmethod
    def drop(cls) -> Fault:
        return cls("drop")

    @classmethod
    def malformed(cls) -> Fault:
        return cls("malformed")

    @classmethod
    def status_code(cls, status: int, message: str) -> Fault:
        return cls("status", status=status, message=message)


Item = str | Reply | Thinker | Fault
Default = str | Thinker | Callable[[dict], str]


class FakeOpenAI:
    """The server; a context manager that runs it in a daemon thread on a free port."""

    def __init__(
        self,
        default: Default = "ok",
        *,
        model: str = "fake-model",
        reject_json_schema: bool = False,
        reject_json_object: bool = False,
        reject_status: int = 400,
        reject_message: str = "Invalid parameter: 'response_format' of type '{type}' is not supported.",
    ):
        self.default = default
        self.model = model
        self.reject_json_schema = reject_json_schema
        self.reject_json_object = reject_json_object
        self.reject_status = reject_status
        self.reject_message = reject_message  # "{type}" is replaced by the rejected type
        self.requests: list[dict] = []
        self._script: deque[Item] = deque()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control ----------------------------------------------------------------------------------

    def script(self, *items: Item) -> FakeOpenAI:
        """Appends items answered in order by the next requests."""
        with self._lock:
            self._script.extend(items)
        return self

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def chat_requests(self) -> list[dict]:
        return [r for r in self.requests if r["path"].endswith("/chat/completions")]

    def start(self) -> FakeOpenAI:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True, name="fakeopenai")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- protocol ---------------------------------------------------------------------------------

    def _next(self, body: dict) -> Item:
        with self._lock:
            if self._script:
                return self._script.popleft()
        if isinstance(self.default, Thinker):
            return self.default
        return self.default(body) if callable(self.default) else self.default

    def completion(self, body: dict, reply: Reply) -> dict:
        return {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.text}
                    | ({"reasoning_content": reply.reasoning_content} if reply.reasoning_content is not None else {}),
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens
                if reply.completion_tokens is not None
                else len(reply.text.split()),
                "total_tokens": reply.prompt_tokens + len(reply.text.split()),
            },
        }


def _make_handler(server: FakeOpenAI):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

        def finish(self) -> None:
            try:
                super().finish()
            except OSError:
                pass

        def _send(self, status: int, payload: bytes, headers: dict | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
            except OSError:  # the client gave up (timeout): nothing to do
                self.close_connection = True

        def _error(self, status: int, message: str, headers: dict | None = None) -> None:
            err = {"error": {"message": message, "type": "fake_error", "code": status}}
            self._send(status, json.dumps(err).encode(), headers)

        def do_GET(self) -> None:
            if urlsplit(self.path).path.rstrip("/").endswith("/models"):
                self._send(200, json.dumps({"object": "list", "data": [{"id": server.model, "object": "model"}]}).encode())
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"_raw": raw.decode(errors="replace")}
            url = urlsplit(self.path)  # routed on the path, as real servers do: the query is parameters
            with server._lock:
                server.requests.append({"path": url.path, "query": dict(parse_qsl(url.query, keep_blank_values=True)),
                                        "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
            if not url.path.endswith("/chat/completions"):
                self._error(404, f"no route {self.path}")
                return
            kind = (body.get("response_format") or {}).get("type")
            if (kind == "json_schema" and server.reject_json_schema) or (
                kind == "json_object" and server.reject_json_object
            ):
                self._error(server.reject_status, server.reject_message.replace("{type}", kind))
                return
            item = server._next(body)
            if isinstance(item, str):
                item = Reply(item)
            if isinstance(item, Thinker):
                item = item.reply(body)
            if isinstance(item, Reply):
                self._send(200, json.dumps(server.completion(body, item)).encode())
                return
            f = item
            if f.kind in ("rate_limit", "server_error", "status"):
                headers = f.headers
                if headers is None and f.retry_after is not None:
                    headers = {"Retry-After": f"{f.retry_after:g}"}
                self._error(f.status, f.message, headers)
            elif f.kind == "slow":
                time.sleep(f.delay_s)
                self._send(200, json.dumps(server.completion(body, Reply(f.then))).encode())
            elif f.kind == "drop":
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            elif f.kind == "malformed":
                self._send(200, b'{"id": "chatcmpl-broken", "choices": [{"index": 0, "message": ')
            else:
                raise ValueError(f"unknown fault {f.kind!r}")

    return Handler
