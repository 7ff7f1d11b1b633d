"""What every editing stage shares: the bounds and the metadata key, argument checks, the
edited copy of a message, a cache keyed by message objects, and checked message counts.

>>> check_int("keep", 3, 0)
3
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from ....errors import TrimmingError
from ....message import Message
from ..counters import SimpleTokenCounter

__all__ = ["MAX_VALUE", "EDIT_KEY", "DEFAULT_CUT_MARKER", "CACHE_SIZE", "TRUSTED", "check_int", "check_counter",
           "edited", "ObjectCache", "checked_counts"]

MAX_VALUE = 1 << 53
EDIT_KEY = "context_edit"
DEFAULT_CUT_MARKER = "\n[... {omitted} tokens omitted ...]\n"
CACHE_SIZE = 8192
#: counters whose message count is additive in the content (and whose counts need no check)
TRUSTED = ("SimpleTokenCounter", "TiktokenTokenCounter", "HFTokenCounter")


def check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or value > MAX_VALUE:
        raise ValueError(f"{name} must be an int between {lo} and 2**53, got {value!r}")
    return value


def check_counter(counter: Any) -> Any:
    counter = SimpleTokenCounter() if counter is None else counter
    if not (callable(getattr(counter, "count_message", None)) and callable(getattr(counter, "count_messages", None))):
        raise TypeError(
            "counter: expected a TokenCounterProtocol (count_message(m), count_messages(ms)), "
            f"got {type(counter).__name__}"
        )
    return counter


def edited(m: Message, update: dict[str, Any], edit: dict[str, Any]) -> Message:
    meta = dict(m.metadata)
    meta[EDIT_KEY] = edit
    update = dict(update)
    update["metadata"] = meta
    return m.model_copy(update=update)


class ObjectCache:
    """Values keyed by a Message object (its identity, held weakly), at most ``size`` of them."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._d: dict[int, tuple[Any, Any]] = {}
        self._size = size

    def get(self, m: Any) -> Any:
        e = self._d.get(id(m))
        if e is not None and e[0]() is m:
            return e[1]
        return None

    def put(self, m: Any, value: Any) -> None:
        d = self._d
        d[id(m)] = (weakref.ref(m), value)
        if len(d) > self._size:
            for key in list(d)[: len(d) - (self._size * 3) // 4]:
                del d[key]


def checked_counts(counter: Any, messages: Sequence[Message]) -> np.ndarray:
    fn = getattr(counter, "count_array", None)
    if fn is not None:
        arr = np.asarray(fn(messages), dtype=np.int64)
    else:
        arr = np.array([int(counter.count_message(m)) for m in messages], dtype=np.int64)
    if type(counter).__name__ not in TRUSTED and len(arr):
        values = arr.tolist()
        if min(values) < 0 or max(values) > MAX_VALUE:
            raise TrimmingError(f"counter {counter!r} returned a count outside [0, 2**53]")
    return np.ascontiguousarray(arr)
