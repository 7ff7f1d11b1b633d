"""The ``ModelClient`` façade: the last step of the design document's path, ``invoke(messages)``.

- :class:`ModelClient` is the Protocol an LLM node calls:
  ``invoke(messages, *, tools=None, config=None) -> Message`` and ``async ainvoke(...)``.
- :class:`OpenAIChatClient` speaks to any OpenAI-compatible chat-completions endpoint through
  the official ``openai`` package (extra ``[openai]``, imported when a client is built).
- :func:`check_tool_calls` refuses a reply whose tool calls could not be answered: every call
  needs a non-empty string ``id``, a ``function.name`` and ``function.arguments`` that parse as
  a JSON object (``""`` counts as no arguments). The clients run it before returning, so a
  malformed reply raises :class:`~jianmu_fast.errors.ModelCallError` before anything is stored.

Retries (``OpenAIChatClient``): HTTP 408, 429 and 5xx, timeouts and connection errors are
retried up to ``max_retries`` times, waiting ``backoff * 2**k`` seconds before retry ``k + 1``
(at most ``max_backoff``), or what the server's ``Retry-After`` / ``retry-after-ms`` header
asks (also capped at ``max_backoff``). Other statuses raise at once. The final failure raises
``ModelCallError`` with ``status`` (``None`` for a timeout or connection error), ``body`` (the
first 500 characters of the response) and ``attempts``.

The returned assistant :class:`~jianmu_fast.message.Message` carries the provider's figures in
``metadata``: ``usage`` (the response's ``usage`` object as sent), ``model``,
``response_id`` and ``finish_reason`` (each when the response has it), and
``reasoning_content`` / ``refusal`` when present. ``metadata`` never goes back to the API.

>>> from jianmu_fast.testing import ChatCompletionsServer
>>> from jianmu_fast.message import human
>>> with ChatCompletionsServer(["Hello!"]) as server:
...     client = OpenAIChatClient("my-model", base_url=server.base_url, api_key="local")
...     reply = client.invoke([human("Hi")], config={"temperature": 0})
...     client.close()
>>> reply.role, reply.content, sorted(reply.metadata["usage"])
('assistant', 'Hello!', ['completion_tokens', 'prompt_tokens', 'total_tokens'])
>>> server.requests[0]["model"], server.requests[0]["temperature"], server.requests[0]["messages"]
('my-model', 0, [{'role': 'user', 'content': 'Hi'}])
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import time
from typing import Any, Iterable, Mapping, Optional, Protocol, Sequence, runtime_checkable

from .errors import MaxStepsExceededError, ModelCallError
from .message import Message, coerce_messages

__all__ = ["ModelClient", "OpenAIChatClient", "ModelCallError", "MaxStepsExceededError", "check_tool_calls"]

_EXCERPT = 500
_RETRY_STATUSES = frozenset({408, 429})
_NOT_CONFIG = frozenset({"messages", "tools", "stream"})


@runtime_checkable
class ModelClient(Protocol):
    """What an LLM node calls. ``messages`` are Messages (or chat-completions dicts), ``tools``
    OpenAI tool schemas (``{"type": "function", "function": {...}}``), ``config`` per-call
    model settings (``temperature``, ``max_tokens``, ...). Returns the assistant Message; its
    ``tool_calls``, when present, passed :func:`check_tool_calls`."""

    def invoke(
        self,
        messages: Sequence[Any],
        *,
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        config: Optional[Mapping[str, Any]] = None,
    ) -> Message:
        """One model call; raise ``ModelCallError`` when it fails."""
        ...

    async def ainvoke(
        self,
        messages: Sequence[Any],
        *,
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        config: Optional[Mapping[str, Any]] = None,
    ) -> Message:
        """``invoke`` for ``asyncio``."""
        ...


def _excerpt(text: Any) -> str:
    s = text if isinstance(text, str) else repr(text)
    return s if len(s) <= _EXCERPT else s[:_EXCERPT] + "..."


def parse_arguments(arguments: Any, where: str) -> dict[str, Any]:
    """The JSON object of a tool call's ``arguments`` string (``""`` is ``{}``).

    >>> parse_arguments('{"x": 2}', "tool_calls[0]")
    {'x': 2}
    >>> parse_arguments('{"x": 2', "tool_calls[0]")
    Traceback (most recent call last):
    ...
    ValueError: tool_calls[0].function.arguments is not JSON (Expecting ',' delimiter: line 1 column 8 (char 7)): '{"x": 2'
    """
    if not isinstance(arguments, str):
        raise ValueError(f"{where}.function.arguments must be a JSON string, got {type(arguments).__name__}")
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        raise ValueError(f"{where}.function.arguments is not JSON ({exc}): {_excerpt(arguments)!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}.function.arguments must be a JSON object, got {_excerpt(arguments)!r}")
    return value


def check_tool_calls(message: Message, where: str = "reply") -> Message:
    """Return ``message`` when every tool call can be answered; else ``ModelCallError`` naming
    the call and the field.

    >>> from jianmu_fast.message import ai
    >>> call = {"type": "function", "function": {"name": "calc", "arguments": "{}"}}
    >>> check_tool_calls(ai(None, tool_calls=[call]))
    Traceback (most recent call last):
    ...
    jianmu_fast.errors.ModelCallError: reply.tool_calls[0].id: missing; every tool call needs a non-empty string id to be answered
    """
    seen: set[str] = set()
    for i, call in enumerate(message.tool_calls or ()):
        at = f"{where}.tool_calls[{i}]"
        cid = call.get("id")
        if not isinstance(cid, str) or not cid:
            raise ModelCallError(
                f"{at}.id: {'missing' if cid is None else repr(cid)}; every tool call needs a non-empty "
                "string id to be answered", status=200, body=_excerpt(json.dumps(call, default=str)))
        if cid in seen:
            raise ModelCallError(f"{at}.id: {cid!r} is used twice in one reply", status=200,
                                 body=_excerpt(json.dumps(call, default=str)))
        seen.add(cid)
        try:
            parse_arguments(call["function"].get("arguments", ""), at)
        except ValueError as exc:
            raise ModelCallError(str(exc), status=200, body=_excerpt(json.dumps(call, default=str))) from None
    return message


def message_from_completion(data: Any, where: str = "reply") -> Message:
    """The assistant Message of a chat-completions response body (a dict), checked.

    >>> body = {"id": "r1", "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
    ...         "message": {"role": "assistant", "content": "4"}}], "usage": {"total_tokens": 9}}
    >>> m = message_from_completion(body)
    >>> m.content, m.metadata
    ('4', {'usage': {'total_tokens': 9}, 'model': 'm', 'response_id': 'r1', 'finish_reason': 'stop'})
    """
    body = _excerpt(json.dumps(data, default=str)) if not isinstance(data, str) else _excerpt(data)
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ModelCallError(f"{where}: the response has no choices[0]; not a chat-completions reply",
                             status=200, body=body)
    msg = choices[0].get("message")
    if not isinstance(msg, dict):
        raise ModelCallError(f"{where}: choices[0].message is missing", status=200, body=body)
    content = msg.get("content")
    raw_calls = msg.get("tool_calls") or None
    calls: Optional[list[dict[str, Any]]] = None
    if raw_calls is not None:
        if not isinstance(raw_calls, list):
            raise ModelCallError(f"{where}.tool_calls: expected a list, got {type(raw_calls).__name__}",
                                 status=200, body=body)
        calls = []
        for i, c in enumerate(raw_calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise ModelCallError(f"{where}.tool_calls[{i}].function.name: missing; cannot tell which tool "
                                     "to run", status=200, body=body)
            call: dict[str, Any] = {"id": c.get("id"), "type": c.get("type") or "function",
                                    "function": {"name": fn["name"], "arguments": fn.get("arguments", "")}}
            calls.append(call)
    meta: dict[str, Any] = {}
    for key, value in (("usage", data.get("usage")), ("model", data.get("model")), ("response_id", data.get("id")),
                       ("finish_reason", choices[0].get("finish_reason")),
                       ("reasoning_content", msg.get("reasoning_content")), ("refusal", msg.get("refusal"))):
        if value is not None:
            meta[key] = value
    if content is None and not calls:
        content = ""
    try:
        fields: dict[str, Any] = {"tool_calls": calls} if calls else {}
        reply = Message(role="assistant", content=content, metadata=meta, **fields)
    except ValueError as exc:
        raise ModelCallError(f"{where}: cannot read the assistant message ({exc})", status=200, body=body) from None
    return check_tool_calls(reply, where)


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ImportError(
            "OpenAIChatClient needs the openai package: pip install 'jianmu_fast[openai]'"
        ) from exc
    return openai


class OpenAIChatClient:
    """A :class:`ModelClient` for any OpenAI-compatible chat-completions endpoint.

    ``model`` is sent with every request; ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``) and
    ``api_key`` default to the ``openai`` package's (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``);
    with a ``base_url`` and no key anywhere, the placeholder ``"not-needed"`` is sent (local
    servers ignore it). ``timeout`` is seconds per request; ``max_retries``, ``backoff`` and
    ``max_backoff`` are described in the module docstring (the ``openai`` package's own retries
    are off). ``config`` keys that ``chat.completions.create`` takes (``temperature``,
    ``max_tokens``, ``tool_choice``, ...) are passed as such, any other key goes in the request
    body as is (``extra_body``, e.g. vLLM's ``top_k``); ``model`` in ``config`` overrides the
    client's. Streaming is not supported.

    ``invoke`` reuses one HTTP connection pool (``close()`` releases it); ``ainvoke`` opens and
    closes its own async client per call, so it works from any event loop.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model: expected a non-empty model name, got {model!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries: expected an int >= 0, got {max_retries!r}")
        for name, value in (("backoff", backoff), ("max_backoff", max_backoff)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name}: expected seconds >= 0, got {value!r}")
        openai = _import_openai()
        if api_key is None and not os.environ.get("OPENAI_API_KEY"):
            if base_url is None and not os.environ.get("OPENAI_BASE_URL"):
                raise ValueError(
                    "api_key: no key given and OPENAI_API_KEY is not set; pass api_key=..., or "
                    "base_url=... for a local endpoint that needs none"
                )
            api_key = "not-needed"
        self.model = model
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self._openai = openai
        self._kwargs: dict[str, Any] = dict(api_key=api_key, base_url=base_url, timeout=self.timeout, max_retries=0)
        self._client = openai.OpenAI(**self._kwargs)
        self.base_url = str(self._client.base_url).rstrip("/")
        self._create_params = frozenset(inspect.signature(self._client.chat.completions.create).parameters)

    def __repr__(self) -> str:
        return f"OpenAIChatClient({self.model!r}, base_url={self.base_url!r})"

    def close(self) -> None:
        """Release the HTTP connections of ``invoke``."""
        self._client.close()

    def __enter__(self) -> "OpenAIChatClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the request ------------------------------------------------------------------------

    def _request(self, messages: Sequence[Any], tools: Optional[Sequence[Mapping[str, Any]]],
                 config: Optional[Mapping[str, Any]]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model,
                                  "messages": [m.to_openai() for m in coerce_messages(messages)]}
        if tools:
            if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Iterable):
                raise TypeError(f"tools: expected a list of tool schemas, got {type(tools).__name__}")
            kwargs["tools"] = [dict(t) for t in tools]
        if config is not None:
            if not isinstance(config, Mapping):
                raise TypeError(f"config: expected a mapping of model settings, got {type(config).__name__}")
            extra: dict[str, Any] = {}
            for key, value in config.items():
                if key in _NOT_CONFIG:
                    raise ValueError(f"config[{key!r}]: not a model setting (the client sets {key!r} itself"
                                     f"{'; streaming is not supported' if key == 'stream' else ''})")
                if key in self._create_params:
                    kwargs[key] = value
                else:
                    extra[key] = value
            if extra:
                kwargs["extra_body"] = {**kwargs.get("extra_body", {}), **extra}
        return kwargs

    def _delay(self, attempt: int, headers: Any) -> float:
        asked = None
        if headers is not None:
            for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
                value = headers.get(name)
                if value is not None:
                    try:
                        asked = float(value) * scale
                    except ValueError:
                        continue
                    break
        if asked is not None and asked >= 0:
            return min(asked, self.max_backoff)
        return min(self.backoff * (2 ** attempt), self.max_backoff)

    def _classify(self, exc: BaseException, attempts: int) -> tuple[bool, Any, ModelCallError]:
        """(retryable, response headers, the error to raise when no retry is left)."""
        openai = self._openai
        where = f"POST {self.base_url}/chat/completions (model {self.model!r})"
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            body = _excerpt(exc.response.text)
            err = ModelCallError(f"{where} failed with HTTP {status} after {attempts} attempt(s): {body}",
                                 status=status, body=body, attempts=attempts)
            return status in _RETRY_STATUSES or status >= 500, exc.response.headers, err
        if isinstance(exc, openai.APITimeoutError):
            return True, None, ModelCallError(
                f"{where} timed out (timeout={self.timeout}s) after {attempts} attempt(s); raise timeout= "
                "or check the server", status=None, attempts=attempts)
        if isinstance(exc, openai.APIConnectionError):
            return True, None, ModelCallError(
                f"{where} could not connect after {attempts} attempt(s) ({exc.__cause__ or exc}); check "
                "base_url and that the server is running", status=None, attempts=attempts)
        return False, None, ModelCallError(f"{where} failed: {type(exc).__name__}: {exc}", attempts=attempts)

    def _reply(self, raw: Any, attempts: int) -> Message:
        text = raw.text
        try:
            data = json.loads(text)
        except ValueError:
            raise ModelCallError(
                f"POST {self.base_url}/chat/completions (model {self.model!r}) answered HTTP {raw.status_code} "
                f"with a body that is not JSON: {_excerpt(text)}", status=raw.status_code, body=_excerpt(text),
                attempts=attempts) from None
        try:
            return message_from_completion(data)
        except ModelCallError as exc:
            exc.attempts = attempts
            raise

    def invoke(
        self,
        messages: Sequence[Any],
        *,
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        config: Optional[Mapping[str, Any]] = None,
    ) -> Message:
        """One chat-completions call (with the retries); the checked assistant Message."""
        kwargs = self._request(messages, tools, config)
        create = self._client.chat.completions.with_raw_response.create
        for attempt in range(self.max_retries + 1):
            try:
                raw = create(**kwargs)
            except self._openai.OpenAIError as exc:
                retry, headers, err = self._classify(exc, attempt + 1)
                if not retry or attempt == self.max_retries:
                    raise err from exc
                time.sleep(self._delay(attempt, headers))
                continue
            return self._reply(raw, attempt + 1)
        raise AssertionError("unreachable")  # pragma: no cover

    async def ainvoke(
        self,
        messages: Sequence[Any],
        *,
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        config: Optional[Mapping[str, Any]] = None,
    ) -> Message:
        """``invoke`` for ``asyncio`` (``openai.AsyncOpenAI``, ``asyncio.sleep`` between retries)."""
        kwargs = self._request(messages, tools, config)
        async with self._openai.AsyncOpenAI(**self._kwargs) as client:
            create = client.chat.completions.with_raw_response.create
            for attempt in range(self.max_retries + 1):
                try:
                    raw = await create(**kwargs)
                except self._openai.OpenAIError as exc:
                    retry, headers, err = self._classify(exc, attempt + 1)
                    if not retry or attempt == self.max_retries:
                        raise err from exc
                    await asyncio.sleep(self._delay(attempt, headers))
                    continue
                return self._reply(raw, attempt + 1)
        raise AssertionError("unreachable")  # pragma: no cover
