"""A scripted chat-completions endpoint on 127.0.0.1, for tests and examples (stdlib only).

:class:`ChatCompletionsServer` answers ``POST .../chat/completions`` with the next item of
its script and records every request body it received (``server.requests``), in order, so a
test can assert on exactly what a client sent. A script item is:

- a ``str``: an assistant reply with that text;
- a ``dict``: the assistant ``message`` as the API sends it (``content``, ``tool_calls``, ...);
- a :class:`Reply`: a message plus the HTTP status, headers, raw body, usage, finish reason, or
  a delay before answering (to make a client time out);
- a callable: called with the request body, returns one of the above.

When the script is empty the server answers HTTP 400 ``"script exhausted"`` (not retried).
``tool_call(name, arguments, id)`` builds one call in the API's shape.

>>> import json, urllib.request
>>> with ChatCompletionsServer(["hi there"]) as server:
...     req = urllib.request.Request(server.base_url + "/chat/completions",
...                                  data=json.dumps({"model": "m", "messages": []}).encode())
...     body = json.load(urllib.request.urlopen(req))
>>> body["choices"][0]["message"], server.requests
({'role': 'assistant', 'content': 'hi there'}, [{'model': 'm', 'messages': []}])
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Optional, Union

__all__ = ["ChatCompletionsServer", "Reply", "tool_call"]


def tool_call(name: str, arguments: Union[str, dict[str, Any]], id: Optional[str] = None) -> dict[str, Any]:
    """One tool call as the API sends it (``arguments`` given as a dict are JSON-encoded).

    >>> tool_call("calc", {"x": 2}, "c1")
    {'id': 'c1', 'type': 'function', 'function': {'name': 'calc', 'arguments': '{"x": 2}'}}
    """
    call: dict[str, Any] = {"type": "function", "function": {
        "name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}
    if id is not None:
        call = {"id": id, **call}
    return call


@dataclass
class Reply:
    """One scripted answer with full control over the HTTP exchange."""

    message: Union[str, dict[str, Any], None] = None
    """The assistant message (text or dict); ignored when ``body`` is set."""
    status: int = 200
    """HTTP status of the answer."""
    body: Union[str, dict[str, Any], None] = None
    """The raw response body (a dict is sent as JSON), instead of a chat completion."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra response headers (e.g. ``{"retry-after-ms": "10"}``)."""
    delay: float = 0.0
    """Seconds to wait before answering."""
    usage: Optional[dict[str, Any]] = None
    """The ``usage`` object (default: counts derived from the request and reply lengths)."""
    finish_reason: Optional[str] = None
    """Default ``"tool_calls"`` when the message calls tools, else ``"stop"``."""


Script = Union[str, dict[str, Any], Reply, Callable[[dict[str, Any]], Any]]


class ChatCompletionsServer:
    """A chat-completions server on ``127.0.0.1`` (an ephemeral port) answering from a script.

    Use it as a context manager (or ``start()`` / ``close()``); ``base_url`` is
    ``http://127.0.0.1:<port>/v1``; ``add(*items)`` appends to the script; ``requests`` holds
    every request body received, in arrival order (also those answered with an error).
    """

    def __init__(self, script: Iterable[Script] = (), *, model: str = "scripted-model") -> None:
        self.script: deque[Script] = deque(script)
        self.requests: list[dict[str, Any]] = []
        self.model = model
        self._lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._n = 0

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (the server must be started)."""
        if self._server is None:
            raise RuntimeError("ChatCompletionsServer is not started; use it in a with block or call start()")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def add(self, *items: Script) -> None:
        """Append ``items`` to the script."""
        with self._lock:
            self.script.extend(items)

    def start(self) -> "ChatCompletionsServer":
        """Bind 127.0.0.1 on a free port and serve in a daemon thread."""
        if self._server is None:
            self._server = _Server(("127.0.0.1", 0), _handler(self))
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                            name="ChatCompletionsServer", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join()
            self._server = None

    def __enter__(self) -> "ChatCompletionsServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- answering ----------------------------------------------------------------------------

    def _next(self, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes, float]:
        with self._lock:
            self.requests.append(body)
            item = self.script.popleft() if self.script else None
            self._n += 1
            n = self._n
        if item is None:
            return 400, {}, json.dumps({"error": {"message": "script exhausted", "type": "invalid_request_error"}}).encode(), 0.0
        if callable(item) and not isinstance(item, Reply):
            item = item(body)
        reply = item if isinstance(item, Reply) else Reply(message=item)
        if reply.body is not None:
            raw = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
            return reply.status, reply.headers, raw.encode(), reply.delay
        msg = {"role": "assistant", "content": reply.message} if isinstance(reply.message, str) else dict(reply.message or {})
        msg.setdefault("role", "assistant")
        finish = reply.finish_reason or ("tool_calls" if msg.get("tool_calls") else "stop")
        prompt = len(json.dumps(body.get("messages", []))) // 4 + len(json.dumps(body.get("tools", []))) // 4
        completion = len(json.dumps(msg)) // 4
        usage = reply.usage if reply.usage is not None else {
            "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        completion_body = {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1700000000,
                           "model": body.get("model", self.model),
                           "choices": [{"index": 0, "message": msg, "finish_reason": finish}], "usage": usage}
        return reply.status, reply.headers, json.dumps(completion_body).encode(), reply.delay


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (after a timeout) is not an error of the server."""


def _handler(owner: ChatCompletionsServer) -> type:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {}, b'{"error": {"message": "unknown path"}}')
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._send(400, {}, b'{"error": {"message": "body is not JSON"}}')
                return
            status, headers, payload, delay = owner._next(body)
            if delay:
                time.sleep(delay)
            self._send(status, headers, payload)

        def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                pass  # the client gave up (timeout)

    return Handler
