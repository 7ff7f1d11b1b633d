"""How the SQLite backend writes values and messages: JSON, with Messages tagged.

A value is stored as JSON text. JSON types pass as they are (a tuple comes back as a list);
a :class:`~jianmu_fast.message.Message` anywhere inside a value is written as
``{"$jianmu_message": <record>}``. A message *record* is
``message.model_dump(exclude_unset=True)`` plus its ``id``: the fields that were set, so
``to_openai()`` gives the same dict after a round trip, with ``id`` and ``metadata`` kept.
Anything else (a set, bytes, an object, a dict key that is not a string, a dict key
``"$jianmu_message"``) is refused with a ``TypeError`` that names its path, so nothing is
silently changed on the way in.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from ..message.model import Message

__all__ = ["MESSAGE_TAG", "message_to_record", "message_from_record", "encode_value", "decode_value", "encode_message", "decode_message"]

MESSAGE_TAG = "$jianmu_message"


def message_to_record(m: Message) -> dict[str, Any]:
    """The dict a message is stored as (set fields plus ``id``).

    >>> from jianmu_fast.message import human
    >>> sorted(message_to_record(human("hi", id="m1", metadata={"k": 1})))
    ['content', 'id', 'metadata', 'role']
    """
    d = m.model_dump(exclude_unset=True)
    d["id"] = m.id
    return d


def message_from_record(d: dict[str, Any]) -> Message:
    """Rebuild a message from :func:`message_to_record`'s dict.

    >>> from jianmu_fast.message import ai
    >>> m = ai("hello", metadata={"k": 1})
    >>> message_from_record(message_to_record(m)) == m
    True
    """
    return Message.model_validate(d)


def _walk(v: Any, path: str) -> Any:
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    if isinstance(v, Message):
        return {MESSAGE_TAG: _walk(message_to_record(v), f"{path}<Message>")}
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError(f"{path}: dict keys must be strings to be stored as JSON, got {k!r}")
            if k == MESSAGE_TAG:
                raise TypeError(f"{path}: the dict key {MESSAGE_TAG!r} is reserved for stored messages")
            out[k] = _walk(x, f"{path}[{k!r}]")
        return out
    if isinstance(v, (list, tuple)):
        return [_walk(x, f"{path}[{i}]") for i, x in enumerate(v)]
    raise TypeError(
        f"{path}: a {type(v).__name__} cannot be stored as JSON; store str, int, float, bool, None, "
        "list, dict with string keys, or Message"
    )


def _hook(d: dict[str, Any]) -> Any:
    if MESSAGE_TAG in d and len(d) == 1:
        return message_from_record(d[MESSAGE_TAG])
    return d


def encode_value(value: Any, where: str = "value") -> str:
    """JSON text of ``value``; ``TypeError`` naming the path for what JSON cannot hold.

    >>> encode_value({"n": 1, "t": (1, 2)})
    '{"n":1,"t":[1,2]}'
    >>> encode_value({"s": {1, 2}}, "state['x']")
    Traceback (most recent call last):
    ...
    TypeError: state['x']['s']: a set cannot be stored as JSON; store str, int, float, bool, None, list, dict with string keys, or Message
    """
    return json.dumps(_walk(value, where), ensure_ascii=False, separators=(",", ":"))


def decode_value(text: str) -> Any:
    """Inverse of :func:`encode_value` (tagged records become Messages again).

    >>> from jianmu_fast.message import human
    >>> m = human("hi")
    >>> decode_value(encode_value({"last": m}))["last"] == m
    True
    """
    return json.loads(text, object_hook=_hook)


def encode_message(m: Message, where: str = "message") -> str:
    """JSON text of one message record (for the messages table).

    >>> from jianmu_fast.message import human
    >>> decode_message(encode_message(human("hi", id="x"))).id
    'x'
    """
    return json.dumps(_walk(message_to_record(m), where), ensure_ascii=False, separators=(",", ":"))


def decode_message(text: str) -> Message:
    """Inverse of :func:`encode_message`; raises ``ValueError`` for a record that is not a message."""
    d = json.loads(text, object_hook=_hook)
    if not isinstance(d, dict):
        raise ValueError(f"expected a message record (a JSON object), got {type(d).__name__}")
    try:
        return message_from_record(d)
    except ValidationError as exc:
        raise ValueError(str(exc)) from None
