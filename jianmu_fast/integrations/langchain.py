"""LangChain / LangGraph: lossless message conversion, ``trim_messages``, a LangGraph hook.

``pip install 'jianmu_fast[langchain]'`` (langchain-core, langgraph); imported lazily.

Conversion (:func:`from_langchain`, :func:`to_langchain`) maps ``SystemMessage``,
``HumanMessage``, ``AIMessage`` (``tool_calls`` become OpenAI-shape calls with JSON
``arguments``) and ``ToolMessage`` onto :class:`~jianmu_fast.message.Message` and back:

===========================  ===============================================================
LangChain                    Message
===========================  ===============================================================
``type``                     ``role`` (system, user, assistant, tool)
``content``                  ``content``; bare-string blocks of a list become text blocks
``name``, ``tool_call_id``   the same fields
``id``                       ``id`` (a new uuid when LangChain's is ``None``)
``additional_kwargs``        ``extra`` (keys that are Message fields go to metadata)
``tool_calls``               ``tool_calls`` (``{"id", "type": "function", "function"}``)
everything else              ``metadata["langchain"]``: ``response_metadata``,
                             ``invalid_tool_calls``, ``usage_metadata``, ``artifact``,
                             ``status``, extra fields, where the above could not say it all
===========================  ===============================================================

and the other way, what a Message has that LangChain lacks (``metadata``, a ``None``
content, tool calls LangChain cannot parse) rides in an extra field ``jianmu`` of the
LangChain message (LangChain messages accept extra fields; chat models ignore them).
``from_langchain(to_langchain(ms)) == ms`` and ``to_langchain(from_langchain(ls)) == ls``.

``invalid_tool_calls`` (calls whose arguments did not parse) stay in metadata and are not
part of the tool-call transaction: LangGraph's ``ToolNode`` never runs them.

Trimming an agent's model input, the graph state untouched: a LangGraph ``pre_model_hook``
(:func:`pre_model_hook`) or, for LangChain v1's ``create_agent`` (``langchain>=1.0``), the
agent middleware ``ContextBuilderMiddleware(builder)``, which also budgets the request's
tools (made on first use, so this module imports no framework)::

    from jianmu_fast.integrations.langchain import ContextBuilderMiddleware
    agent = create_agent(model, tools, middleware=[ContextBuilderMiddleware(builder)])

>>> from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
>>> lc = [HumanMessage("2+2?", id="h1"),
...       AIMessage("", id="a1", tool_calls=[{"name": "calc", "args": {"e": "2+2"}, "id": "c1"}]),
...       ToolMessage("4", tool_call_id="c1", id="t1")]
>>> ms = from_langchain(lc)
>>> ms[1].tool_calls[0]["function"]
{'name': 'calc', 'arguments': '{"e": "2+2"}'}
>>> to_langchain(ms) == lc
True
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from ..errors import MessageValidationError
from ..message import Message, coerce_message

__all__ = [
    "from_langchain",
    "to_langchain",
    "message_from_langchain",
    "message_to_langchain",
    "trim_messages",
    "pre_model_hook",
    "ContextBuilderMiddleware",
    "MessageConverter",
]

_EXTRA_HINT = "pip install 'jianmu_fast[langchain]'"
_TYPE_ROLE = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
_FIELD_KEYS = frozenset(("role", "content", "name", "tool_call_id", "tool_calls"))
_LC = "langchain"  # Message.metadata key
_CHANNEL = "jianmu"  # extra field of a LangChain message


def _lc_messages() -> Any:
    try:
        import langchain_core.messages as lcm
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ImportError(f"jianmu_fast.integrations.langchain needs langchain-core: {_EXTRA_HINT}") from exc
    return lcm


def _oa_call(call: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if call.get("id") is not None:
        out["id"] = call["id"]
    out["type"] = "function"
    out["function"] = {"name": call["name"], "arguments": json.dumps(call["args"], ensure_ascii=False)}
    return out


def _lc_call(call: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The LangChain ToolCall for an OpenAI call, or None when it has none."""
    fn = call.get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except ValueError:
        return None
    if not isinstance(args, dict):
        return None
    return {"name": fn.get("name"), "args": args, "id": call.get("id"), "type": "tool_call"}


def _is_base_message(m: Any) -> bool:
    return hasattr(m, "type") and hasattr(m, "content") and hasattr(m, "additional_kwargs")


def message_from_langchain(m: Any, where: str = "message") -> Message:
    """One LangChain message as a :class:`Message` (see the module docstring).

    >>> from langchain_core.messages import ToolMessage
    >>> m = message_from_langchain(ToolMessage("r", tool_call_id="c1", status="error", id="t"))
    >>> m.role, m.tool_call_id, m.metadata
    ('tool', 'c1', {'langchain': {'status': 'error'}})
    """
    if not _is_base_message(m):
        raise MessageValidationError(f"{where}: expected a LangChain BaseMessage, got {type(m).__name__}")
    role = _TYPE_ROLE.get(m.type)
    if role is None:
        raise MessageValidationError(
            f"{where}: LangChain message type {m.type!r} ({type(m).__name__}) has no chat-completions "
            "role; supported: SystemMessage, HumanMessage, AIMessage, ToolMessage"
        )
    rec: dict[str, Any] = {}
    content = m.content
    if isinstance(content, list):
        pos = [i for i, b in enumerate(content) if isinstance(b, str)]
        if pos:
            content = [{"type": "text", "text": b} if isinstance(b, str) else b for b in content]
            rec["str_blocks"] = pos
    fields: dict[str, Any] = {"role": role, "content": content}
    if m.name is not None:
        fields["name"] = m.name
    if m.id is not None:
        fields["id"] = m.id
    else:
        rec["id"] = None
    if m.additional_kwargs:
        extra = {k: v for k, v in m.additional_kwargs.items() if k not in _FIELD_KEYS}
        clash = {k: v for k, v in m.additional_kwargs.items() if k in _FIELD_KEYS}
        if extra:
            fields["extra"] = extra
        if clash:
            rec["additional_kwargs"] = clash
    if m.response_metadata:
        rec["response_metadata"] = m.response_metadata
    model_extra = dict(m.model_extra or {})
    chan = model_extra.pop(_CHANNEL, None) or {}
    if model_extra:
        rec["extra_fields"] = model_extra
    if role == "assistant":
        if "openai_tool_calls" in chan:
            fields["tool_calls"] = chan["openai_tool_calls"]
            invalid = chan.get("invalid_tool_calls")
        else:
            invalid = m.invalid_tool_calls
            if m.tool_calls:
                calls = [_oa_call(c) for c in m.tool_calls]
                fields["tool_calls"] = calls
                if [_lc_call(c) for c in calls] != m.tool_calls:
                    rec["tool_calls"] = m.tool_calls
        if invalid:
            rec["invalid_tool_calls"] = invalid
        if m.usage_metadata is not None:
            rec["usage_metadata"] = m.usage_metadata
    elif "openai_tool_calls" in chan:
        fields["tool_calls"] = chan["openai_tool_calls"]
    if role == "tool":
        fields["tool_call_id"] = m.tool_call_id
        if m.artifact is not None:
            rec["artifact"] = m.artifact
        if m.status != "success":
            rec["status"] = m.status
    elif "tool_call_id" in chan:
        fields["tool_call_id"] = chan["tool_call_id"]
    for f in chan.get("none", ()):
        fields[f] = None
    metadata = dict(chan.get("metadata") or {})
    if rec:
        metadata[_LC] = rec
    if metadata:
        fields["metadata"] = metadata
    try:
        return Message(**fields)
    except Exception as exc:  # pydantic's ValidationError, with our location
        raise MessageValidationError(f"{where} ({type(m).__name__}): {exc}") from None


def message_to_langchain(m: Message) -> Any:
    """One :class:`Message` as a LangChain message (see the module docstring).

    >>> from jianmu_fast.message import ai
    >>> lc = message_to_langchain(ai("hi", id="a1"))
    >>> type(lc).__name__, lc.content, lc.id
    ('AIMessage', 'hi', 'a1')
    """
    lcm = _lc_messages()
    rec = m.metadata.get(_LC) or {}
    rest = {k: v for k, v in m.metadata.items() if k != _LC}
    chan: dict[str, Any] = {}
    none = [f for f in ("content", "name", "tool_calls", "tool_call_id")
            if getattr(m, f) is None and f in m.model_fields_set]
    content: Any = m.content
    if content is None:
        content = ""
    elif isinstance(content, list) and rec.get("str_blocks"):
        content = list(content)
        for i in rec["str_blocks"]:
            content[i] = content[i]["text"]
    kwargs: dict[str, Any] = {"content": content, "id": None if "id" in rec else m.id}
    if m.name is not None:
        kwargs["name"] = m.name
    ak = {**m.extra, **(rec.get("additional_kwargs") or {})}
    if ak:
        kwargs["additional_kwargs"] = ak
    if rec.get("response_metadata"):
        kwargs["response_metadata"] = rec["response_metadata"]
    kwargs.update(rec.get("extra_fields") or {})
    if m.role == "assistant":
        invalid = list(rec.get("invalid_tool_calls") or ())
        calls = m.tool_calls or []
        if "tool_calls" in rec and [_oa_call(c) for c in rec["tool_calls"]] == calls:
            lc_calls = rec["tool_calls"]
        else:
            lc_calls, created = [], []
            for c in calls:
                lc = _lc_call(c)
                if lc is None:
                    fn = c.get("function") or {}
                    created.append({"type": "invalid_tool_call", "id": c.get("id"), "name": fn.get("name"),
                                    "args": fn.get("arguments"), "error": "arguments are not a JSON object"})
                else:
                    lc_calls.append(lc)
            if created or [_oa_call(c) for c in lc_calls] != calls:
                chan["openai_tool_calls"] = m.tool_calls
                if invalid:
                    chan["invalid_tool_calls"] = invalid
            invalid += created
        if lc_calls:
            kwargs["tool_calls"] = lc_calls
        if invalid:
            kwargs["invalid_tool_calls"] = invalid
        if "usage_metadata" in rec:
            kwargs["usage_metadata"] = rec["usage_metadata"]
        cls = lcm.AIMessage
    elif m.role == "tool":
        kwargs["tool_call_id"] = m.tool_call_id or ""
        if "artifact" in rec:
            kwargs["artifact"] = rec["artifact"]
        if "status" in rec:
            kwargs["status"] = rec["status"]
        cls = lcm.ToolMessage
    else:
        cls = lcm.SystemMessage if m.role == "system" else lcm.HumanMessage
    if m.role != "assistant" and m.tool_calls is not None:
        chan["openai_tool_calls"] = m.tool_calls
    if m.role != "tool" and m.tool_call_id is not None:
        chan["tool_call_id"] = m.tool_call_id
    if none:
        chan["none"] = none
    if rest:
        chan["metadata"] = rest
    if chan:
        kwargs[_CHANNEL] = chan
    return cls(**kwargs)


def from_langchain(messages: Any) -> list[Message]:
    """LangChain messages (or anything ``convert_to_messages`` takes) as Messages.

    >>> [m.role for m in from_langchain([("system", "Be terse."), ("human", "hi")])]
    ['system', 'user']
    """
    items = _as_lc_list(messages)
    return [message_from_langchain(m, f"messages[{i}]") for i, m in enumerate(items)]


def to_langchain(messages: Iterable[Any]) -> list[Any]:
    """Messages (or chat-completions dicts) as LangChain messages.

    >>> [type(m).__name__ for m in to_langchain([{"role": "user", "content": "hi"}])]
    ['HumanMessage']
    """
    return [message_to_langchain(coerce_message(m, f"messages[{i}]")) for i, m in enumerate(messages)]


def _as_lc_list(messages: Any) -> list[Any]:
    items = list(messages) if not hasattr(messages, "to_messages") else messages.to_messages()
    lcm = _lc_messages()
    base = lcm.BaseMessage
    if all(isinstance(m, base) for m in items):
        return items
    return lcm.convert_to_messages(items)


class MessageConverter:
    """LangChain -> Message conversion cached by object identity, for hot loops.

    A LangChain message converted before is returned as the same :class:`Message` while its
    ``content``, ``tool_calls`` and ``additional_kwargs`` are the same objects; mutating a
    content *list* in place is not noticed (assigning a new content is). At most
    ``max_size`` entries are kept (the cache is cleared when full); an entry keeps its
    LangChain message alive until then. Thread-safe (single dict operations).

    >>> from langchain_core.messages import HumanMessage
    >>> conv, h = MessageConverter(), HumanMessage("hi", id="h")
    >>> conv(h) is conv(h)
    True
    """

    def __init__(self, max_size: int = 50_000) -> None:
        self.max_size = max_size
        self._cache: dict[int, tuple[Any, Any, Any, Any, Message]] = {}

    def __call__(self, m: Any, where: str = "message") -> Message:
        e = self._cache.get(id(m))
        tc = getattr(m, "tool_calls", None)
        if e is not None and e[0] is m and e[1] is m.content and e[2] is tc and e[3] is m.additional_kwargs:
            return e[4]
        out = message_from_langchain(m, where)
        if len(self._cache) >= self.max_size:
            self._cache.clear()
        self._cache[id(m)] = (m, m.content, tc, m.additional_kwargs, out)
        return out

    def many(self, messages: Sequence[Any]) -> list[Message]:
        """Convert a list (cached per message)."""
        return [self(m, f"messages[{i}]") for i, m in enumerate(messages)]


def _check_builder(builder: Any) -> None:
    if not callable(getattr(builder, "transform", None)):
        raise TypeError(f"builder: expected a ContextBuilder, got {type(builder).__name__}")


class _BuilderRun:
    """Runs a builder over LangChain messages and returns LangChain messages.

    Messages that come back unchanged are the very input objects; new or edited ones are
    converted (and cached by identity, as the inputs are, by :class:`MessageConverter`).
    """

    def __init__(self, builder: Any) -> None:
        _check_builder(builder)
        self.builder = builder
        self.conv = MessageConverter()
        self.back_cache: dict[int, tuple[Message, Any]] = {}

    def __call__(self, lc_msgs: Sequence[Any], rest: Mapping[str, Any],
                 tools_schema: Optional[Sequence[dict[str, Any]]] = None) -> list[Any]:
        msgs = self.conv.many(lc_msgs)
        back = {id(m): lc for m, lc in zip(msgs, lc_msgs)}
        builder = self.builder
        kw = {} if tools_schema is None else {"tools_schema": tools_schema}
        if getattr(builder, "providers", None):
            out = builder.build({**rest, "messages": msgs}, **kw)
        else:
            out = builder.transform(msgs, **kw)
        result = []
        for m in out:
            lc = back.get(id(m))
            if lc is None:
                e = self.back_cache.get(id(m))
                if e is None or e[0] is not m:
                    if len(self.back_cache) > 10_000:
                        self.back_cache.clear()
                    e = self.back_cache[id(m)] = (m, message_to_langchain(m))
                lc = e[1]
            result.append(lc)
        return result


def pre_model_hook(builder: Any, *, messages_key: str = "messages") -> Callable[[Any], dict[str, Any]]:
    """A LangGraph ``pre_model_hook`` that runs ``builder`` on the graph's messages.

    Returns ``{"llm_input_messages": [...]}``, so the model sees the built prompt and the
    graph state is left untouched. A builder with providers runs ``build({"messages":
    history, ...other state keys})`` (history as Messages, for ``StateHistoryProvider``);
    one with filters only runs ``transform(history)``. Messages that come back unchanged are
    the very LangChain objects of the state; new or edited ones are converted. Conversions
    are cached by identity (:class:`MessageConverter`), so a turn converts only new messages.
    (A hook does not see the model's tools; :class:`ContextBuilderMiddleware` does.)

    >>> from langchain_core.messages import HumanMessage
    >>> from jianmu_fast.memory.context import ContextBuilder, MaxMessagesFilter
    >>> hook = pre_model_hook(ContextBuilder(filters=[MaxMessagesFilter(1)]))
    >>> state = {"messages": [HumanMessage("a", id="1"), HumanMessage("b", id="2")]}
    >>> [m.content for m in hook(state)["llm_input_messages"]]
    ['b']
    """
    run = _BuilderRun(builder)

    def hook(state: Any) -> dict[str, Any]:
        if isinstance(state, Mapping):
            raw, rest = state[messages_key], {k: v for k, v in state.items() if k != messages_key}
        else:
            raw, rest = getattr(state, messages_key), {}
        return {"llm_input_messages": run(_as_lc_list(raw), rest)}

    return hook


# -- LangChain v1 agent middleware (``langchain.agents.create_agent``) ---------------------------


def _tools_schema(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """The request's tools in OpenAI ``{"type": "function", ...}`` shape, for the budget.

    Provider built-in tools (dicts without a function name, e.g. ``{"type": "web_search"}``)
    have no token formula and are left out of the count.
    """
    from langchain_core.utils.function_calling import convert_to_openai_tool

    out = []
    for t in tools:
        if isinstance(t, Mapping) and not isinstance((t.get("function") or t).get("name"), str):
            continue
        out.append(convert_to_openai_tool(t))
    return out


def _middleware_class() -> type:
    try:
        from langchain.agents.middleware import AgentMiddleware
    except ImportError as exc:
        raise ImportError(
            "jianmu_fast.integrations.langchain.ContextBuilderMiddleware needs langchain>=1.0 "
            f"(langchain.agents.middleware): {_EXTRA_HINT}"
        ) from exc

    class ContextBuilderMiddleware(AgentMiddleware):  # type: ignore[misc,valid-type]
        """A LangChain v1 agent middleware that runs a ``ContextBuilder`` on every model call.

        ``wrap_model_call`` (and ``awrap_model_call``) hand the model
        ``request.override(system_message=..., messages=built)``: the agent's state is never
        changed, so every message stays in the history and the next call sees it all again.
        The builder gets the request's system message (``create_agent(system_prompt=...)``)
        followed by its messages, and the request's tools as ``tools_schema`` (converted with
        ``convert_to_openai_tool``, cached per tool list), so a ``TokenBudgetFilter`` budgets
        messages plus tools, the whole request. If what it builds starts with a system message,
        that becomes the request's ``system_message``; the rest are its ``messages``; the model
        receives exactly the built list. A builder with providers runs ``build({"messages":
        history, ...other state keys})``; one with filters only runs ``transform(history)``.
        Kept messages are the very objects of the state; conversions are cached by identity.
        """

        def __init__(self, builder: Any) -> None:
            super().__init__()
            self.builder = builder
            self._run = _BuilderRun(builder)
            self._tools: tuple[list[Any], list[dict[str, Any]]] = ([], [])

        def _schema(self, tools: Sequence[Any]) -> list[dict[str, Any]]:
            seen, schema = self._tools
            if len(seen) != len(tools) or any(a is not b for a, b in zip(seen, tools)):
                schema = _tools_schema(tools)
                self._tools = (list(tools), schema)
            return schema

        def _request(self, request: Any) -> Any:
            lc_msgs = list(request.messages)
            if request.system_message is not None:
                lc_msgs.insert(0, request.system_message)
            state = request.state
            rest = {k: v for k, v in state.items() if k != "messages"} if isinstance(state, Mapping) else {}
            out = self._run(_as_lc_list(lc_msgs), rest, self._schema(request.tools or []))
            if out and out[0].type == "system":
                return request.override(system_message=out[0], messages=out[1:])
            return request.override(system_message=None, messages=out)

        def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
            """Run the builder, then the model on what it built."""
            return handler(self._request(request))

        async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
            """Async twin of :meth:`wrap_model_call` (the builder itself is synchronous)."""
            return await handler(self._request(request))

    ContextBuilderMiddleware.__module__ = __name__
    ContextBuilderMiddleware.__qualname__ = "ContextBuilderMiddleware"
    return ContextBuilderMiddleware


def __getattr__(name: str) -> Any:
    # ContextBuilderMiddleware subclasses langchain's AgentMiddleware (create_agent looks at
    # which hooks a subclass overrides), so the class is made on first use: importing this
    # module imports no framework.
    if name == "ContextBuilderMiddleware":
        cls = globals()[name] = _middleware_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


from ._langchain_trim import trim_messages  # noqa: E402  (uses MessageConverter above)
