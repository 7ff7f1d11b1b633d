"""What the chat-template counter's hot path shares with its frames (``_template_frames``) and
its compiled twin (``_template_core``): one definition of each, outside the ``memory.context``
package (the cores import nothing from it, so importing them never starts that package)."""

import json
import threading
from typing import Any, Optional

__all__ = ["DERIVED", "NOT_YET", "Refused", "derivation_id", "dumps_parsed", "freeze", "json_inside"]


class Refused(Exception):
    """The template refused to render a conversation (``raise_exception``, or any error it
    raised); the counter reports it as ``MessageValidationError``."""


#: a cache's answer for "not known yet" (None being a known answer)
NOT_YET = object()
#: ``json.dumps(x, ensure_ascii=False)`` without building an encoder per call
_DUMPS = json.JSONEncoder(ensure_ascii=False).encode
_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)
#: the C encoder ``_DUMPS`` builds on each call, built once, without the circular-reference
#: check (only for JSON parsed from text, which cannot hold a cycle)
_ENCODE_PARSED = (_C_ENCODER(None, json.JSONEncoder().default, json.encoder.encode_basestring, None, ": ", ", ",
                             False, False, True) if _C_ENCODER is not None else None)


def dumps_parsed(x: Any) -> str:
    """``json.dumps(x, ensure_ascii=False)`` for ``x`` parsed from JSON text (no cycles).

    >>> dumps_parsed({"a": [1, 2.5, None, "é\\n"]}) == json.dumps({"a": [1, 2.5, None, "é\\n"]}, ensure_ascii=False)
    True
    """
    if _ENCODE_PARSED is None or type(x) is str:
        return _DUMPS(x)
    return "".join(_ENCODE_PARSED(x, 0))


def freeze(v: Any) -> Any:
    """A hashable stand-in of a template value, type and structure kept (a frame shape's
    fixed field: ``freeze(v) == freeze(w)`` only where a template reads them alike).

    >>> freeze({"type": "text", "n": [1, True]})
    ('d', (('type', ('str', 'text')), ('n', ('l', (('int', 1), ('bool', True))))))
    """
    if isinstance(v, dict):
        return ("d", tuple((k, freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return ("l", tuple(freeze(x) for x in v))
    return (type(v).__name__, v)


def json_inside(v: str) -> str:
    """What ``tojson`` prints for the string ``v``, without its quotes.

    >>> json_inside('a "b"')
    'a \\\\"b\\\\"'
    """
    return json.dumps(v, ensure_ascii=False)[1:-1]


#: a frame's slot numbers at and past this are *derived*: ``slot + k * DERIVED`` is what the
#: derivation ``k`` (``_DERIVATIONS[k]``: a strip method's name and its ``chars``) makes of field
#: ``slot`` (``_template_frames``: a template that strips a field prints the stripped value)
DERIVED = 1 << 24
#: the derivations by number (from 1), and their numbers by ``(name, chars)``; a process's
#: templates strip with a handful of them between them (``derivation_id`` adds a new one)
_DERIVATIONS: list = [None]
_DERIVATION_IDS: dict = {}
_DERIVATION_LOCK = threading.Lock()


def derivation_id(name: str, chars: Optional[str]) -> int:
    """The number of the derivation ``str.<name>(value, chars)`` (``name``: "strip", "lstrip"
    or "rstrip"), given one the first time it is asked for.

    >>> k = derivation_id("strip", "\\n"); k == derivation_id("strip", "\\n") and _DERIVATIONS[k] == ("strip", "\\n")
    True
    """
    key = (name, chars)
    k = _DERIVATION_IDS.get(key)
    if k is None:
        with _DERIVATION_LOCK:
            k = _DERIVATION_IDS.get(key)
            if k is None:
                _DERIVATIONS.append(key)
                k = _DERIVATION_IDS[key] = len(_DERIVATIONS) - 1
    return k  # type: ignore[no-any-return]
