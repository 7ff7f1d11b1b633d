"""The message record every provider, filter and counter works on.

A :class:`Message` is an immutable pydantic v2 model in the OpenAI chat-completions shape,
plus a stable ``id`` and a free ``metadata`` dict that never goes to the model API.
``to_openai()`` / ``from_openai()`` are the only conversion path, and they are lossless:
``Message.from_openai(d).to_openai() == d`` for every valid chat-completions message dict,
including provider-specific keys (kept in ``extra``).

Deeply immutable where it is counted: content blocks and ``tool_calls`` are copied when a
Message is made (``FrozenList`` of ``FrozenDict``, nested lists and dicts too), so neither the
caller's original lists nor the message's own can change a message that a cache has counted
(an in-place edit raises ``TypeError``). They compare equal to plain lists and dicts and
serialize as such; ``to_openai()`` returns fresh, mutable dicts and lists. ``metadata`` and
``extra`` stay ordinary dicts: no counter reads them.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterable, Literal, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import MessageValidationError

__all__ = [
    "Role",
    "Message",
    "FrozenDict",
    "FrozenList",
    "system",
    "human",
    "ai",
    "tool",
    "coerce_message",
    "coerce_messages",
]

Role = Literal["system", "user", "assistant", "tool"]
_ROLES = ("system", "user", "assistant", "tool")
#: chat-completions keys that map onto fields; any other key of a dict goes to ``extra``
_OPENAI_KEYS = frozenset(("role", "content", "name", "tool_call_id", "tool_calls"))


def _new_id() -> str:
    return uuid.uuid4().hex


def _readonly(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise TypeError(
        f"{type(self).__name__}: a Message's content blocks and tool_calls are immutable (counts "
        "are cached per message); build a new message instead, e.g. "
        "m.model_copy(update={'tool_calls': [...]})"
    )


class FrozenDict(dict):  # type: ignore[type-arg]
    """A dict that cannot be changed in place; equal to (and JSON-encoded as) a plain dict.

    >>> d = FrozenDict({"type": "text", "text": "hi"})
    >>> d == {"type": "text", "text": "hi"}, d
    (True, {'type': 'text', 'text': 'hi'})
    >>> d["text"] = "changed"
    Traceback (most recent call last):
    ...
    TypeError: FrozenDict: a Message's content blocks and tool_calls are immutable (counts are cached per message); build a new message instead, e.g. m.model_copy(update={'tool_calls': [...]})
    """

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _readonly
    clear = pop = popitem = setdefault = update = _readonly

    def __reduce__(self) -> Any:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> "FrozenDict":
        return self


class FrozenList(list):  # type: ignore[type-arg]
    """A list that cannot be changed in place; equal to (and JSON-encoded as) a plain list.

    >>> FrozenList([1, 2]) == [1, 2]
    True
    >>> FrozenList([1]).append(2)
    Traceback (most recent call last):
    ...
    TypeError: FrozenList: a Message's content blocks and tool_calls are immutable (counts are cached per message); build a new message instead, e.g. m.model_copy(update={'tool_calls': [...]})
    """

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _readonly
    append = extend = insert = pop = remove = clear = sort = reverse = _readonly

    def __reduce__(self) -> Any:
        return (FrozenList, (list(self),))

    def __copy__(self) -> "FrozenList":
        return self


def freeze(value: Any) -> Any:
    """``value`` with every dict and list in it (recursively) replaced by a frozen copy.

    >>> type(freeze([{"a": [1]}])[0]["a"]).__name__
    'FrozenList'
    """
    t = type(value)
    if t is FrozenDict or t is FrozenList:
        return value  # frozen all the way down when made here
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return FrozenList([freeze(v) for v in value])
    if t is tuple:
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy of the dicts and lists in ``value`` (other leaves shared).

    >>> type(thaw(FrozenList([FrozenDict(a=1)]))[0]).__name__
    'dict'
    """
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    if type(value) is tuple:
        return tuple(thaw(v) for v in value)
    return value


class Message(BaseModel):
    """One chat message.

    >>> m = Message(role="user", content="What is 2+2?")
    >>> m.role, m.content, len(m.id)
    ('user', 'What is 2+2?', 32)
    >>> Message.from_openai({"role": "user", "content": "hi"}).to_openai()
    {'role': 'user', 'content': 'hi'}
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)

    role: Role
    """Who speaks: ``system``, ``user``, ``assistant`` or ``tool``."""

    content: Union[str, list[dict[str, Any]], None] = None
    """Text, a list of structured content blocks (each a dict with a ``type``), or ``None``
    for an assistant message that only calls tools."""

    name: Optional[str] = None
    """Optional participant name (chat-completions ``name``)."""

    tool_call_id: Optional[str] = None
    """For ``role="tool"``: the id of the call this message answers."""

    tool_calls: Optional[list[dict[str, Any]]] = None
    """For ``role="assistant"``: calls in the OpenAI shape
    ``{"id": ..., "type": "function", "function": {"name": ..., "arguments": "<json>"}}``.
    ``id`` may be missing (older internal histories); ``sanitize_tool_call_history`` fills it."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free annotations (``semantic_kind``, ``tool_result``, ...); never sent to the model."""

    extra: dict[str, Any] = Field(default_factory=dict)
    """Other chat-completions keys (``refusal``, ``reasoning_content``, ...), carried through
    ``from_openai``/``to_openai`` unchanged."""

    id: str = Field(default_factory=_new_id)
    """Stable identifier (uuid4 hex, 32 characters), kept by copies of this message."""

    @field_validator("content")
    @classmethod
    def _check_content(cls, v: Any) -> Any:
        if isinstance(v, list):
            for i, block in enumerate(v):
                btype = block.get("type")
                if not isinstance(btype, str):
                    raise ValueError(f"content block [{i}] needs a string 'type', got {btype!r}")
                if btype == "text" and not isinstance(block.get("text"), str):
                    raise ValueError(f"content block [{i}] of type 'text' needs a string 'text'")
            return freeze(v)
        return v

    @field_validator("tool_calls")
    @classmethod
    def _check_tool_calls(cls, v: Any) -> Any:
        if v is None:
            return v
        for i, call in enumerate(v):
            cid = call.get("id")
            if cid is not None and not isinstance(cid, str):
                raise ValueError(f"tool_calls[{i}].id must be a string or missing, got {cid!r}")
            fn = call.get("function")
            if not isinstance(fn, dict):
                raise ValueError(f"tool_calls[{i}].function must be a dict with 'name' and 'arguments'")
            if not isinstance(fn.get("name"), str) or not fn["name"]:
                raise ValueError(f"tool_calls[{i}].function.name must be a non-empty string")
            args = fn.get("arguments", "")
            if not isinstance(args, str):
                raise ValueError(
                    f"tool_calls[{i}].function.arguments must be a JSON string, got {type(args).__name__}"
                )
        return freeze(v)

    @field_validator("extra")
    @classmethod
    def _check_extra(cls, v: dict[str, Any]) -> dict[str, Any]:
        clash = _OPENAI_KEYS.intersection(v)
        if clash:
            raise ValueError(f"extra must not hold message fields, found {sorted(clash)}")
        return v

    def model_copy(self, *, update: Optional[Mapping[str, Any]] = None, deep: bool = False) -> "Message":
        """A copy with ``update`` applied; new content blocks and tool calls are frozen copies.

        >>> m = human("a").model_copy(update={"content": [{"type": "text", "text": "b"}]})
        >>> type(m.content).__name__, m.text()
        ('FrozenList', 'b')
        """
        if deep or type(self) is not Message or (update and not _FIELDS.issuperset(update)):
            if update and ("content" in update or "tool_calls" in update):
                update = dict(update)
                for key in ("content", "tool_calls"):
                    if key in update:
                        update[key] = freeze(update[key])
            return super().model_copy(update=update, deep=deep)
        # what pydantic's shallow model_copy does (__copy__, then the update), without its
        # generic steps: the hot loop's annotated copies (StateHistoryProvider) take this path
        if update:
            d = {**self.__dict__, **update}
            fields_set = self.__pydantic_fields_set__ | update.keys()
            c = d["content"]
            if c is not None and type(c) is not str:
                d["content"] = freeze(c)  # the message's own frozen blocks come back as they are
            if d["tool_calls"] is not None:
                d["tool_calls"] = freeze(d["tool_calls"])
        else:
            d = self.__dict__.copy()
            fields_set = set(self.__pydantic_fields_set__)
        new = _new_message(Message)
        _setattr(new, "__dict__", d)
        _setattr(new, "__pydantic_extra__", None)
        _setattr(new, "__pydantic_fields_set__", fields_set)
        _setattr(new, "__pydantic_private__", None)
        return new

    # -- conversion -------------------------------------------------------------------

    @classmethod
    def from_openai(cls, d: Mapping[str, Any]) -> "Message":
        """Build a message from a chat-completions dict.

        Keys other than role/content/name/tool_call_id/tool_calls are kept in ``extra``.
        A bad dict raises :class:`MessageValidationError` naming the field.

        >>> Message.from_openai({"role": "tool", "content": "4", "tool_call_id": "c1"}).tool_call_id
        'c1'
        """
        return coerce_message(d)

    def to_openai(self) -> dict[str, Any]:
        """The chat-completions dict of this message (``id`` and ``metadata`` stay local).

        A field is written when it was given or is not ``None``, so
        ``Message.from_openai(d).to_openai() == d``.

        >>> ai(None, tool_calls=[{"id": "c1", "type": "function",
        ...     "function": {"name": "calc", "arguments": "{}"}}]).to_openai()["content"] is None
        True
        """
        out: dict[str, Any] = {"role": self.role}
        fields_set = self.model_fields_set
        c = self.content
        if c is not None or "content" in fields_set:
            out["content"] = c if type(c) is not FrozenList else thaw(c)
        if self.name is not None or "name" in fields_set:
            out["name"] = self.name
        if self.tool_calls is not None or "tool_calls" in fields_set:
            out["tool_calls"] = thaw(self.tool_calls)
        if self.tool_call_id is not None or "tool_call_id" in fields_set:
            out["tool_call_id"] = self.tool_call_id
        if self.extra:
            out.update(thaw(self.extra))
        return out

    def text(self) -> str:
        """The message text: ``content`` itself, or its text blocks joined by newlines.

        >>> Message(role="user", content=[{"type": "text", "text": "a"},
        ...                               {"type": "text", "text": "b"}]).text()
        'a\\nb'
        """
        c = self.content
        if c is None:
            return ""
        if isinstance(c, str):
            return c
        return "\n".join(b["text"] for b in c if b.get("type") == "text")


_FIELDS = frozenset(Message.model_fields)
_new_message = object.__new__
_setattr = object.__setattr__


_CONTENT_AND_METADATA = frozenset(("content", "metadata"))


def _with_text(m: Message, content: Optional[str], metadata: dict[str, Any]) -> Message:
    """``m.model_copy(update={"content": content, "metadata": metadata})`` for a text (or
    ``None``) content, without the generic steps: the hot loop's annotated copies
    (``StateHistoryProvider``). ``m`` must be a ``Message`` (not a subclass).

    >>> c = _with_text(human("a"), "b", {"k": 1})
    >>> (c.content, c.metadata, sorted(c.model_fields_set)) == ("b", {"k": 1}, ["content", "metadata", "role"])
    True
    """
    d = m.__dict__.copy()
    d["content"] = content
    d["metadata"] = metadata
    new = _new_message(Message)
    _setattr(new, "__dict__", d)
    _setattr(new, "__pydantic_extra__", None)
    _setattr(new, "__pydantic_fields_set__", m.__pydantic_fields_set__ | _CONTENT_AND_METADATA)
    _setattr(new, "__pydantic_private__", None)
    return new


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _validation_message(err: ValidationError, where: str) -> str:
    parts = []
    for e in err.errors(include_url=False):
        loc = _format_loc(tuple(x for x in e["loc"] if not (isinstance(x, str) and "[" in x)))
        path = f"{where}.{loc}" if loc else where
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{path}: {msg}")
    return "; ".join(parts)


def coerce_message(item: Any, where: str = "message") -> Message:
    """Return ``item`` as a :class:`Message` (a Message, or a chat-completions dict).

    ``where`` names the item in errors, e.g. ``"messages[3]"``.

    >>> coerce_message({"role": "user", "content": "hi"}).role
    'user'
    >>> coerce_message({"role": "robot"}, "messages[2]")
    Traceback (most recent call last):
    ...
    jianmu_fast.errors.MessageValidationError: messages[2].role: Input should be 'system', 'user', 'assistant' or 'tool'
    """
    if isinstance(item, Message):
        return item
    if not isinstance(item, Mapping):
        raise MessageValidationError(
            f"{where}: expected a Message or a chat-completions dict, got {type(item).__name__}"
        )
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in item.items():
        if k in _OPENAI_KEYS:
            fields[k] = v
        elif isinstance(k, str):
            extra[k] = v
        else:
            raise MessageValidationError(f"{where}: keys must be strings, got {k!r}")
    if "role" not in fields:
        raise MessageValidationError(f"{where}.role: field required")
    if extra:
        fields["extra"] = extra
    try:
        return Message(**fields)
    except ValidationError as exc:
        raise MessageValidationError(_validation_message(exc, where)) from None


def coerce_messages(items: Iterable[Any], where: str = "messages") -> list[Message]:
    """Return a new list of :class:`Message` from Messages and chat-completions dicts.

    >>> [m.role for m in coerce_messages([{"role": "user", "content": "hi"}, ai("hello")])]
    ['user', 'assistant']
    """
    if isinstance(items, (str, bytes, Mapping)):
        raise MessageValidationError(f"{where}: expected a list of messages, got {type(items).__name__}")
    return [m if type(m) is Message else coerce_message(m, f"{where}[{i}]") for i, m in enumerate(items)]


# -- factories ------------------------------------------------------------------------


def system(content: Union[str, list[dict[str, Any]]], **kwargs: Any) -> Message:
    """A ``role="system"`` message.

    >>> system("You are a helpful assistant.").role
    'system'
    """
    return Message(role="system", content=content, **kwargs)


def human(content: Union[str, list[dict[str, Any]]], **kwargs: Any) -> Message:
    """A ``role="user"`` message.

    >>> human("What is 2+2?").role
    'user'
    """
    return Message(role="user", content=content, **kwargs)


def ai(
    content: Union[str, list[dict[str, Any]], None] = None,
    tool_calls: Optional[list[dict[str, Any]]] = None,
    **kwargs: Any,
) -> Message:
    """A ``role="assistant"`` message, optionally calling tools.

    >>> ai("The answer is 4.").content
    'The answer is 4.'
    """
    if tool_calls is not None:
        kwargs["tool_calls"] = tool_calls
    return Message(role="assistant", content=content, **kwargs)


def tool(
    content: Union[str, list[dict[str, Any]]],
    name: Optional[str] = None,
    tool_call_id: Optional[str] = None,
    **kwargs: Any,
) -> Message:
    """A ``role="tool"`` message carrying a tool's result.

    >>> tool('{"result": 4}', name="calculator").name
    'calculator'
    """
    if name is not None:
        kwargs["name"] = name
    if tool_call_id is not None:
        kwargs["tool_call_id"] = tool_call_id
    return Message(role="tool", content=content, **kwargs)
