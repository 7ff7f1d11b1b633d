"""OpenAI Responses API input items <-> :class:`~jianmu_fast.message.Message`.

No package needed: items are plain dicts (the ``openai`` package's
``ResponseInputItemParam`` TypedDicts describe them).

:func:`from_responses` maps

- a ``message`` item (``type: "message"`` or a bare ``{"role", "content"}``) of role
  ``user``, ``system`` or ``developer`` to a ``user`` / ``system`` Message, its
  ``input_text`` parts to text blocks, other parts (images, files, audio) kept as blocks;
- a run of the model's own output items, ``reasoning``, assistant ``message``,
  ``function_call`` (and any other ``*_call`` item with a ``call_id``, or a hosted-tool item
  such as ``web_search_call``), to **one** assistant Message: its text parts become the
  content, each call becomes an OpenAI-shape tool call whose id is the ``call_id``. A
  reasoning item therefore stays with the call or message that follows it, as the API
  requires. A new run starts at a ``reasoning`` or assistant ``message`` item once the run
  holds a message or a call;
- each ``function_call_output`` (any ``*_call_output`` with a ``call_id``) to a ``tool``
  Message answering that ``call_id``.

So the trimming filters see a ``call_id`` pairing as one transaction (the assistant Message
plus its tool Messages) and keep it whole, and ``sanitize_tool_call_history`` drops an output
whose call is gone. Each Message keeps its original items in ``metadata["responses"]``;
:func:`to_responses` writes them back unchanged while the Message's role, content, tool
calls and ``tool_call_id`` still say what the items say, and builds fresh items from those
fields otherwise (a Message edited by a filter, or one made by a provider). Reasoning text
is not counted as content (the API counts only what it keeps; an approximation).
``to_responses(from_responses(items)) == items``.

>>> items = [{"role": "user", "content": "2+2?"},
...          {"type": "reasoning", "id": "rs_1", "summary": []},
...          {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": '{"e":"2+2"}'},
...          {"type": "function_call_output", "call_id": "c1", "output": "4"}]
>>> ms = from_responses(items)
>>> [(m.role, m.tool_call_id) for m in ms], ms[1].tool_calls[0]["id"]
([('user', None), ('assistant', None), ('tool', 'c1')], 'c1')
>>> to_responses(ms) == items
True
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Optional, Sequence

from ..errors import MessageValidationError
from ..message import Message, coerce_message
from ..message.model import thaw

__all__ = ["from_responses", "to_responses", "ResponsesConverter"]

_KEY = "responses"
_INPUT_ROLES = {"user": "user", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")


def _kind(item: Mapping[str, Any], where: str) -> str:
    """``input`` (user/system message), ``assistant`` (a model output item), ``output``
    (a call's result)."""
    t = item.get("type")
    if "role" in item and t in (None, "message"):
        role = item["role"]
        if role == "assistant":
            return "assistant"
        if role in _INPUT_ROLES:
            return "input"
        raise MessageValidationError(f"{where}.role: expected user, system, developer or assistant, got {role!r}")
    if not isinstance(t, str):
        raise MessageValidationError(f"{where}: an item needs a string 'type' (or a 'role'), got {t!r}")
    if t.endswith("_call_output"):
        if not isinstance(item.get("call_id"), str):
            raise MessageValidationError(f"{where}.call_id: a {t} item needs a string call_id")
        return "output"
    if t in ("function_call", "custom_tool_call") and not isinstance(item.get("call_id"), str):
        raise MessageValidationError(f"{where}.call_id: a {t} item needs a string call_id")
    return "assistant"


def _blocks(content: Any, where: str) -> Any:
    """Message content for a Responses ``content`` / ``output``: a string, or blocks."""
    if isinstance(content, str) or content is None:
        return content
    if not isinstance(content, list):
        raise MessageValidationError(f"{where}: expected a string or a list of parts, got {type(content).__name__}")
    out = []
    for i, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise MessageValidationError(f"{where}[{i}]: expected a part with a string 'type'")
        if part["type"] in _TEXT_PARTS:
            out.append({"type": "text", "text": part.get("text", "")})
        elif part["type"] == "refusal":
            out.append({"type": "text", "text": part.get("refusal", "")})
        else:
            out.append(dict(part))
    return out


def _call(item: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    t = item.get("type")
    if not (isinstance(t, str) and t.endswith("_call") and isinstance(item.get("call_id"), str)):
        return None
    if t == "function_call":
        name, args = item.get("name") or "function", item.get("arguments", "")
    elif t == "custom_tool_call":
        name, args = item.get("name") or t, item.get("input", "")
    else:
        name = t
        args = json.dumps({k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status")},
                          ensure_ascii=False, sort_keys=True)
    return {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": str(args)}}


def _assistant_fields(items: Sequence[Mapping[str, Any]], where: str) -> dict[str, Any]:
    texts: list[Any] = []
    calls = []
    for k, it in enumerate(items):
        if it.get("role") == "assistant":
            texts.append(_blocks(it.get("content"), f"{where}[{k}].content"))
        else:
            c = _call(it)
            if c is not None:
                calls.append(c)
    content: Any
    if not texts:
        content = None
    elif len(texts) == 1 and (isinstance(texts[0], str) or texts[0] is None):
        content = texts[0]
    else:
        content = [b for t in texts for b in ([{"type": "text", "text": t}] if isinstance(t, str) else t or [])]
    fields: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        fields["tool_calls"] = calls
    return fields


def _fields(kind: str, items: Sequence[Mapping[str, Any]], where: str) -> dict[str, Any]:
    if kind == "assistant":
        return _assistant_fields(items, where)
    it = items[0]
    if kind == "input":
        return {"role": _INPUT_ROLES[it["role"]], "content": _blocks(it.get("content"), f"{where}.content")}
    out = it.get("output")
    content = out if isinstance(out, (str, list)) else json.dumps(out, ensure_ascii=False, sort_keys=True)
    return {"role": "tool", "tool_call_id": it["call_id"], "content": _blocks(content, f"{where}.output")}


def _message(kind: str, items: list[dict[str, Any]], where: str) -> Message:
    fields = _fields(kind, items, where)
    try:
        return Message(**fields, metadata={_KEY: {"items": items}})
    except Exception as exc:
        raise MessageValidationError(f"{where}: {exc}") from None


def _convert(items: Any, offset: int = 0) -> tuple[list[Message], list[int]]:
    """Messages of ``items`` and the item index where each one starts (plus ``offset``)."""
    out: list[Message] = []
    starts: list[int] = []
    group: list[dict[str, Any]] = []
    group_at = 0
    has_text_or_call = False
    for i, item in enumerate(items, offset):
        where = f"items[{i}]"
        if type(item) is not dict and not isinstance(item, Mapping):
            raise MessageValidationError(f"{where}: expected a dict, got {type(item).__name__}")
        item = dict(item)
        kind = _kind(item, where)
        if kind == "assistant":
            starts_run = item.get("type") == "reasoning" or item.get("role") == "assistant"
            if group and starts_run and has_text_or_call:
                out.append(_message("assistant", group, f"items[{group_at}:{i}]"))
                starts.append(group_at)
                group = []
            if not group:
                group_at, has_text_or_call = i, False
            group.append(item)
            has_text_or_call = has_text_or_call or item.get("role") == "assistant" or _call(item) is not None
            continue
        if group:
            out.append(_message("assistant", group, f"items[{group_at}:{i}]"))
            starts.append(group_at)
            group = []
        out.append(_message(kind, [item], where))
        starts.append(i)
    if group:
        out.append(_message("assistant", group, f"items[{group_at}:]"))
        starts.append(group_at)
    return out, starts


def from_responses(items: Iterable[Mapping[str, Any]]) -> list[Message]:
    """Responses input items as Messages (see the module docstring for the mapping).

    >>> [m.role for m in from_responses([{"role": "developer", "content": "Be terse."},
    ...                                  {"role": "user", "content": "hi"}])]
    ['system', 'user']
    """
    if isinstance(items, (str, bytes, Mapping)):
        raise MessageValidationError(f"items: expected a list of Responses items, got {type(items).__name__}")
    return _convert(items)[0]


class ResponsesConverter:
    """:func:`from_responses` for a history that grows between calls, and :func:`to_responses`
    for what came back from it, doing work only for what is new.

    The items of the previous call are kept as private deep copies; a call whose items start
    with equal items reuses their Messages (the same objects, so filter caches hit too) and
    converts the rest. Messages it made and that come back unchanged (Messages are immutable)
    are written as their original items without re-checking. Thread-safe (state is swapped
    in one assignment).

    >>> conv = ResponsesConverter()
    >>> a = conv.from_responses([{"role": "user", "content": "hi"}])
    >>> b = conv.from_responses([{"role": "user", "content": "hi"}, {"role": "user", "content": "more"}])
    >>> b[0] is a[0], conv.to_responses(b)
    (True, [{'role': 'user', 'content': 'hi'}, {'role': 'user', 'content': 'more'}])
    """

    def __init__(self) -> None:
        self._state: tuple[list[Any], list[Message], list[int]] = ([], [], [])
        self._made: dict[int, tuple[Message, list[dict[str, Any]]]] = {}

    def from_responses(self, items: Iterable[Mapping[str, Any]]) -> list[Message]:
        """Like :func:`from_responses`, reusing what the previous call converted."""
        import copy

        if isinstance(items, (str, bytes, Mapping)):
            raise MessageValidationError(f"items: expected a list of Responses items, got {type(items).__name__}")
        items = list(items)
        snaps, msgs, starts = self._state
        k, n = 0, min(len(items), len(snaps))
        while k < n and items[k] == snaps[k]:
            k += 1
        j = 0  # messages 0..j-1 end before item k, so the items after cannot change them
        while j < len(msgs):
            end = starts[j + 1] if j + 1 < len(starts) else len(snaps)
            # a model turn ending right at k may go on with the items after k: convert it again
            if not (end < k or (end == k and msgs[j].role != "assistant")):
                break
            j += 1
        if k == len(items) == len(snaps):
            j = len(msgs)
        at = starts[j] if j < len(starts) else len(snaps) if j else 0
        new, new_starts = _convert(items[at:], at)
        out = msgs[:j] + new
        self._state = (snaps[:at] + copy.deepcopy(items[at:]), out, starts[:j] + new_starts)
        made = {id(m): (m, m.metadata[_KEY]["items"]) for m in new}
        if len(self._made) > 100_000:
            self._made = {}
        self._made.update(made)
        return out

    def to_responses(self, messages: Iterable[Any]) -> list[dict[str, Any]]:
        """Like :func:`to_responses`; Messages this converter made are written without checks."""
        out: list[dict[str, Any]] = []
        rest: list[Any] = []
        for m in messages:
            e = self._made.get(id(m))
            if e is not None and e[0] is m:
                if rest:
                    out.extend(to_responses(rest))
                    rest = []
                out.extend(thaw(e[1]))
            else:
                rest.append(m)
        if rest:
            out.extend(to_responses(rest))
        return out


def _parts(content: Any, role: str) -> Any:
    if not isinstance(content, list):
        return content
    text_type = "output_text" if role == "assistant" else "input_text"
    out = []
    for b in content:
        if b.get("type") == "text":
            out.append({"type": text_type, "text": b["text"], **({"annotations": []} if role == "assistant" else {})})
        else:
            out.append(b)
    return out


def _fresh(m: Message) -> list[dict[str, Any]]:
    if m.role == "tool":
        return [{"type": "function_call_output", "call_id": m.tool_call_id or "", "output": _parts(m.content, "user")
                 if m.content is not None else ""}]
    if m.role != "assistant":
        return [{"type": "message", "role": m.role, "content": _parts(m.content, m.role)
                 if m.content is not None else ""}]
    out: list[dict[str, Any]] = []
    if m.content is not None:
        out.append({"type": "message", "role": "assistant", "content": _parts(m.content, "assistant")})
    for c in m.tool_calls or ():
        fn = c["function"]
        out.append({"type": "function_call", "call_id": c.get("id") or "", "name": fn["name"],
                    "arguments": fn.get("arguments", "")})
    return out


def _kept(m: Message) -> Optional[list[dict[str, Any]]]:
    """The original items of ``m`` when its fields still say what they say."""
    rec = m.metadata.get(_KEY)
    items = rec.get("items") if isinstance(rec, Mapping) else None
    if not items:
        return None
    try:
        kind = _kind(items[0], "items[0]")
        want = _fields(kind, items, "items")
    except MessageValidationError:
        return None
    have = {"role": m.role, "content": m.content}
    if m.tool_calls is not None:
        have["tool_calls"] = m.tool_calls
    if m.tool_call_id is not None:
        have["tool_call_id"] = m.tool_call_id
    return list(items) if have == want else None


def to_responses(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Messages (or chat-completions dicts) as Responses input items.

    A Message made by :func:`from_responses` and left unchanged gives back its items; any
    other gives ``message`` / ``function_call`` / ``function_call_output`` items (``name``,
    ``extra`` and ``metadata`` have no place in an item and are not written).

    >>> to_responses([{"role": "assistant", "content": None, "tool_calls": [{"id": "c1",
    ...     "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    ...     {"role": "tool", "tool_call_id": "c1", "content": "ok"}])
    [{'type': 'function_call', 'call_id': 'c1', 'name': 'f', 'arguments': '{}'}, {'type': 'function_call_output', 'call_id': 'c1', 'output': 'ok'}]
    """
    out: list[dict[str, Any]] = []
    for i, raw in enumerate(messages):
        m = coerce_message(raw, f"messages[{i}]")
        kept = _kept(m)
        out.extend(thaw(kept) if kept is not None else thaw(_fresh(m)))
    return out
