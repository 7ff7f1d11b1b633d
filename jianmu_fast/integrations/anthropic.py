"""Anthropic Messages format <-> :class:`~jianmu_fast.message.Message`, and an approximate
Claude token counter.

``pip install 'jianmu_fast[anthropic]'`` is needed only by :func:`validate_anthropic`, which
checks a request against the SDK's types (the conversion works on plain dicts and imports
nothing).

:func:`from_anthropic` maps a request's ``system`` to a ``system`` Message, an assistant
turn to one assistant Message whose ``tool_use`` blocks become OpenAI-shape tool calls (the
``input`` as JSON ``arguments``), and a user turn to its ``tool_result`` blocks, one ``tool``
Message each, plus its other blocks (text, images, documents, kept as blocks) as a user
Message. So Anthropic's rule, every ``tool_use`` answered by a ``tool_result`` in the next
user turn, is the transaction rule the trimming filters and ``sanitize_tool_call_history``
already keep: a ``tool_use`` and its results are kept or dropped together.

:func:`to_anthropic` maps back: every ``system`` Message goes to the top-level ``system``
(Anthropic has no system role inside ``messages``), the tool results of one turn (and the
user blocks that came with them) are merged into one user turn, ``tool_use`` blocks go back
to where they stood among the assistant's blocks. Messages made elsewhere round-trip up to
what the format cannot say: several system messages become one ``system``, and tool-call
``arguments`` come back re-serialized from the ``input`` object (equal as JSON). What Message has no field for (a result's
``is_error``, ``cache_control``, the block order) rides in ``metadata["anthropic"]``, so
``to_anthropic(from_anthropic(ms, system)) == {"system": system, "messages": ms}``.

Claude token counts cannot be computed offline: Anthropic publishes no tokenizer for its
current models (the exact figure comes from the ``messages.count_tokens`` API).
:class:`ApproxClaudeTokenCounter` is an explicit, documented approximation.

>>> req = [{"role": "user", "content": "2+2?"},
...        {"role": "assistant", "content": [{"type": "text", "text": "Let me compute."},
...            {"type": "tool_use", "id": "tu_1", "name": "calc", "input": {"e": "2+2"}}]},
...        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "4"}]}]
>>> ms = from_anthropic(req, system="Be terse.")
>>> [(m.role, m.tool_call_id) for m in ms]
[('system', None), ('user', None), ('assistant', None), ('tool', 'tu_1')]
>>> to_anthropic(ms) == {"system": "Be terse.", "messages": req}
True
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from ..errors import MessageValidationError
from ..memory.context.counters import SimpleTokenCounter
from ..message import Message, coerce_message
from ..message.model import thaw

__all__ = ["from_anthropic", "to_anthropic", "build_anthropic", "validate_anthropic", "AnthropicConverter",
           "ApproxClaudeTokenCounter"]

_KEY = "anthropic"


def _new(where: str, **fields: Any) -> Message:
    try:
        return Message(**fields)
    except Exception as exc:
        raise MessageValidationError(f"{where}: {exc}") from None


def _check_blocks(content: Any, where: str) -> None:
    if not isinstance(content, list):
        raise MessageValidationError(f"{where}: expected a string or a list of content blocks, "
                                     f"got {type(content).__name__}")
    for i, b in enumerate(content):
        if not isinstance(b, Mapping) or not isinstance(b.get("type"), str):
            raise MessageValidationError(f"{where}[{i}]: expected a content block with a string 'type'")


def _user_turn(content: Any, k: int, where: str) -> list[Message]:
    if isinstance(content, str):
        return [_new(where, role="user", content=content, metadata={_KEY: {"turn": k}})]
    _check_blocks(content, f"{where}.content")
    out: list[Message] = []
    run: list[dict[str, Any]] = []

    def flush() -> None:
        if run:
            out.append(_new(where, role="user", content=list(run), metadata={_KEY: {"turn": k}}))
            run.clear()

    for i, b in enumerate(content):
        if b["type"] != "tool_result":
            run.append(dict(b))
            continue
        flush()
        tid = b.get("tool_use_id")
        if not isinstance(tid, str) or not tid:
            raise MessageValidationError(f"{where}.content[{i}].tool_use_id: a tool_result needs a string tool_use_id")
        rec: dict[str, Any] = {"turn": k}
        extra = {x: v for x, v in b.items() if x not in ("type", "tool_use_id", "content")}
        if extra:
            rec["block"] = extra
        body = b.get("content")
        if "content" not in b:
            rec["no_content"] = True
            body = ""
        elif not isinstance(body, str):
            _check_blocks(body, f"{where}.content[{i}].content")
        out.append(_new(f"{where}.content[{i}]", role="tool", content=body, tool_call_id=tid, metadata={_KEY: rec}))
    flush()
    if not out:  # an empty content list
        out.append(_new(where, role="user", content=[], metadata={_KEY: {"turn": k}}))
    return out


def _assistant_turn(content: Any, k: int, where: str) -> Message:
    if isinstance(content, str):
        return _new(where, role="assistant", content=content, metadata={_KEY: {"turn": k}})
    _check_blocks(content, f"{where}.content")
    blocks, calls, at, extras = [], [], [], []
    for i, b in enumerate(content):
        if b["type"] != "tool_use":
            blocks.append(dict(b))
            continue
        if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
            raise MessageValidationError(f"{where}.content[{i}]: a tool_use block needs a string id and name")
        calls.append({"id": b["id"], "type": "function",
                      "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}), ensure_ascii=False)}})
        at.append(i)
        extras.append({x: v for x, v in b.items() if x not in ("type", "id", "name", "input")})
    rec: dict[str, Any] = {"turn": k}
    fields: dict[str, Any] = {"role": "assistant", "content": blocks or None}
    if calls and len(blocks) == 1 and blocks[0].keys() == {"type", "text"} and blocks[0]["type"] == "text":
        fields["content"] = blocks[0]["text"]  # what a chat-completions message with calls says
    if calls:
        fields["tool_calls"] = calls
        rec["tool_use_at"] = at
        if any(extras):
            rec["tool_use_extra"] = extras
    elif not blocks:
        fields["content"] = []
    return _new(where, **fields, metadata={_KEY: rec})


def _system_message(system: Any) -> Message:
    if not isinstance(system, str):
        _check_blocks(system, "system")
    return _new("system", role="system", content=system if isinstance(system, str) else list(system),
                metadata={_KEY: {"system": True}})


def _turn(m: Any, k: int) -> list[Message]:
    where = f"messages[{k}]"
    if not isinstance(m, Mapping):
        raise MessageValidationError(f"{where}: expected a dict, got {type(m).__name__}")
    role = m.get("role")
    if "content" not in m:
        raise MessageValidationError(f"{where}.content: field required")
    if role == "user":
        return _user_turn(m["content"], k, where)
    if role == "assistant":
        return [_assistant_turn(m["content"], k, where)]
    raise MessageValidationError(f"{where}.role: expected 'user' or 'assistant', got {role!r}")


def _check_list(messages: Any) -> None:
    if isinstance(messages, (str, bytes, Mapping)):
        raise MessageValidationError(f"messages: expected a list of Anthropic messages, got {type(messages).__name__}")


def from_anthropic(messages: Iterable[Mapping[str, Any]], system: Any = None) -> list[Message]:
    """An Anthropic request's ``system`` and ``messages`` as Messages (see the module docstring).

    >>> [m.role for m in from_anthropic([{"role": "user", "content": "hi"}], system="Be brief.")]
    ['system', 'user']
    """
    _check_list(messages)
    out: list[Message] = [] if system is None else [_system_message(system)]
    for k, m in enumerate(messages):
        out.extend(_turn(m, k))
    return out


class AnthropicConverter:
    """:func:`from_anthropic` for a conversation that grows between calls: turns equal to the
    previous call's (kept as private deep copies) give back the same Message objects, so only
    new turns are converted and the filters' caches hit. Thread-safe (one state swap per call).

    >>> conv = AnthropicConverter()
    >>> a = conv.from_anthropic([{"role": "user", "content": "hi"}])
    >>> b = conv.from_anthropic([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    >>> b[0] is a[0], len(b)
    (True, 2)
    """

    def __init__(self) -> None:
        self._state: tuple[Any, Any, list[Any], list[list[Message]]] = (None, None, [], [])

    def from_anthropic(self, messages: Iterable[Mapping[str, Any]], system: Any = None) -> list[Message]:
        """Like :func:`from_anthropic`, reusing the Messages of unchanged turns."""
        import copy

        _check_list(messages)
        turns = list(messages)
        sys_snap, sys_msg, snaps, per = self._state
        if system is None:
            sys_snap, sys_msg = None, None
        elif sys_msg is None or system != sys_snap:
            sys_msg, sys_snap = _system_message(system), copy.deepcopy(system)
        k, n = 0, min(len(turns), len(snaps))
        while k < n and turns[k] == snaps[k]:
            k += 1
        new = [_turn(m, i) for i, m in enumerate(turns[k:], k)]
        per = per[:k] + new
        self._state = (sys_snap, sys_msg, snaps[:k] + copy.deepcopy(turns[k:]), per)
        out = [] if sys_msg is None else [sys_msg]
        for ms in per:
            out.extend(ms)
        return out


def _arguments(call: Mapping[str, Any], where: str) -> Any:
    args = call["function"].get("arguments") or "{}"
    try:
        return json.loads(args)
    except ValueError:
        raise MessageValidationError(f"{where}: arguments are not JSON, so no tool_use input: {args[:60]!r}") from None


def _assistant_content(m: Message, where: str) -> Any:
    rec = m.metadata.get(_KEY) or {}
    if not m.tool_calls:
        return m.content if m.content is not None else ""
    c = m.content
    blocks = [{"type": "text", "text": c}] if isinstance(c, str) and c else list(c) if isinstance(c, list) else []
    extras = rec.get("tool_use_extra") or [{}] * len(m.tool_calls)
    uses = [{"type": "tool_use", "id": call.get("id") or "", "name": call["function"]["name"],
             "input": _arguments(call, f"{where}.tool_calls[{i}]"), **(extras[i] if i < len(extras) else {})}
            for i, call in enumerate(m.tool_calls)]
    at = rec.get("tool_use_at")
    if not (isinstance(at, list) and len(at) == len(uses) and at == sorted(at)
            and all(isinstance(p, int) and 0 <= p < len(blocks) + len(uses) for p in at)):
        return blocks + uses
    for p, u in zip(at, uses):
        blocks.insert(p, u)
    return blocks


def _tool_result(m: Message) -> dict[str, Any]:
    rec = m.metadata.get(_KEY) or {}
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id or ""}
    if not (rec.get("no_content") and m.content == "") and m.content is not None:
        out["content"] = m.content
    out.update(rec.get("block") or {})
    return out


def to_anthropic(messages: Iterable[Any]) -> dict[str, Any]:
    """Messages (or chat-completions dicts) as ``{"system": ..., "messages": [...]}``.

    ``system`` is left out when there is no system message. The tool results of one original
    turn (with its other user blocks) form one user turn, and so do consecutive tool results
    of Messages made elsewhere; a user Message after them is a turn of its own (the API joins
    consecutive user turns). An assistant message with tool calls and empty text gets no
    text block (Anthropic refuses empty text blocks). See the module docstring.

    >>> to_anthropic([{"role": "user", "content": "hi"}])
    {'messages': [{'role': 'user', 'content': 'hi'}]}
    """
    systems: list[Message] = []
    turns: list[dict[str, Any]] = []
    prev_marker: Any = None
    prev_tool = False
    for i, raw in enumerate(messages):
        where = f"messages[{i}]"
        m = coerce_message(raw, where)
        if m.role == "system":
            systems.append(m)
            continue
        rec = m.metadata.get(_KEY) or {}
        marker = rec.get("turn")
        role = "assistant" if m.role == "assistant" else "user"
        if m.role == "assistant":
            content: Any = _assistant_content(m, where)
        elif m.role == "tool":
            content = [_tool_result(m)]
        else:
            content = m.content if m.content is not None else ""
        last = turns[-1] if turns else None
        join = last is not None and last["role"] == role and (
            (marker is not None and marker == prev_marker)
            or (marker is None and prev_marker is None and m.role == "tool" and prev_tool))
        if join:
            assert last is not None
            old = last["content"]
            old = [{"type": "text", "text": old}] if isinstance(old, str) else old
            new = [{"type": "text", "text": content}] if isinstance(content, str) else content
            last["content"] = old + new
        else:
            turns.append({"role": role, "content": content})
        prev_marker, prev_tool = marker, m.role == "tool"
    out: dict[str, Any] = {}
    if systems:
        if len(systems) == 1 and systems[0].content is not None:
            out["system"] = systems[0].content
        else:
            blocks: list[Any] = []
            for s in systems:
                c = s.content
                blocks.extend([{"type": "text", "text": c}] if isinstance(c, str) else (c or []))
            out["system"] = blocks
    out["messages"] = thaw(turns)  # plain dicts: a caller may add cache_control and the like
    if "system" in out:
        out["system"] = thaw(out["system"])
    return out


def build_anthropic(builder: Any, messages: Iterable[Mapping[str, Any]], system: Any = None,
                    converter: Any = None) -> dict[str, Any]:
    """Run ``builder`` on an Anthropic request and return the request to send.

    ``from_anthropic`` → ``builder.transform`` (or ``build({"messages": ...})`` when it has
    providers) → ``to_anthropic``: trimming keeps each ``tool_use`` with its ``tool_result``.
    In a loop over a growing conversation pass one :class:`AnthropicConverter` as
    ``converter``, so only new turns are converted.

    >>> from jianmu_fast.memory.context import ContextBuilder, MaxMessagesFilter
    >>> build_anthropic(ContextBuilder(filters=[MaxMessagesFilter(1)]),
    ...                 [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], system="S")
    {'system': 'S', 'messages': [{'role': 'user', 'content': 'b'}]}
    """
    msgs = (converter.from_anthropic(messages, system) if converter is not None
            else from_anthropic(messages, system))
    if getattr(builder, "providers", None):
        out = builder.build({"messages": msgs})
    else:
        out = builder.transform(msgs)
    return to_anthropic(out)


_ADAPTERS: dict[str, Any] = {}


def validate_anthropic(request: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``{"system": ..., "messages": [...]}`` against the installed ``anthropic``
    package's types (``MessageParam``, ``TextBlockParam``) and return it.

    Needs ``pip install 'jianmu_fast[anthropic]'`` (imported here, lazily). A request the
    types refuse raises :class:`MessageValidationError` naming the path.

    >>> validate_anthropic({"messages": [{"role": "user", "content": "hi"}]})["messages"][0]["role"]
    'user'
    >>> validate_anthropic({"messages": [{"role": "robot", "content": "hi"}]})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    jianmu_fast.errors.MessageValidationError: messages[0].role: ...
    """
    try:
        from anthropic.types import MessageParam, TextBlockParam
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ImportError("validate_anthropic needs the anthropic package: pip install 'jianmu_fast[anthropic]'") from exc
    from typing import Iterable as _Iterable, Union

    from pydantic import TypeAdapter, ValidationError

    if not _ADAPTERS:
        _ADAPTERS["messages"] = TypeAdapter(list[MessageParam])
        _ADAPTERS["system"] = TypeAdapter(Union[str, _Iterable[TextBlockParam]])
    for key in ("system", "messages"):
        if key not in request:
            if key == "messages":
                raise MessageValidationError("messages: field required")
            continue
        try:
            _ADAPTERS[key].validate_python(request[key])
        except ValidationError as exc:
            e = exc.errors(include_url=False)[0]
            loc = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in e["loc"]
                          if not (isinstance(x, str) and ("[" in x or x[:1].isupper() or x == "str")))
            raise MessageValidationError(f"{key}{loc}: {e['msg']}") from None
    return dict(request)


class ApproxClaudeTokenCounter(SimpleTokenCounter):
    """An **approximation** of Claude token counts; never exact.

    Anthropic ships no offline tokenizer for its current models, so an exact count needs the
    ``messages.count_tokens`` API call. This counter estimates, per message::

        count_message(m) = SimpleTokenCounter's formula with
                           ceil(len(text) / 3.5)          # chars_per_token, default 3.5
                         + 1600 per image or document block  # Anthropic's figure for a ~1.15 MP image
                         + ceil(len(thinking) / 3.5)      # thinking blocks count by their text
        count_messages(ms) = 3 + sum(count_message(m))

    Use a margin below the context window when trimming with it. ``is_exact`` is ``False``.

    >>> from jianmu_fast.message import human
    >>> c = ApproxClaudeTokenCounter()
    >>> c.is_exact, c.count_text("hello world"), c.count_message(human("hello world"))
    (False, 4, 8)
    """

    is_exact = False
    PER_NON_TEXT_BLOCK = 1600

    def __init__(self, chars_per_token: float = 3.5) -> None:
        super().__init__(chars_per_token)

    def __repr__(self) -> str:
        return f"ApproxClaudeTokenCounter(chars_per_token={self.chars_per_token!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is ApproxClaudeTokenCounter and other.chars_per_token == self.chars_per_token

    def __hash__(self) -> int:
        return hash((ApproxClaudeTokenCounter, self.chars_per_token))

    def count_message(self, message: Message) -> int:
        """Tokens of one message, by the (approximate) formula in the class docstring."""
        total = super().count_message(message)
        content = message.content
        if isinstance(content, list):
            for b in content:
                t = b.get("type")
                if t in ("thinking", "redacted_thinking"):
                    text = b.get("thinking") or b.get("data") or ""
                    total += self.count_text(text if isinstance(text, str) else "") - self.PER_NON_TEXT_BLOCK
        return total
