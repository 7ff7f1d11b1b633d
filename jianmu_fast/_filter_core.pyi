from typing import Any, Callable, Optional, Sequence

from typing_extensions import disjoint_base

import numpy as np
import numpy.typing as npt

__all__ = [
    "KNOWN_MAX",
    "MAX_VALUE",
    "ROLE_CODES",
    "Records",
    "counts_of",
    "plan_window",
    "plan_windows",
    "sanitize_window",
    "sanitize_windows",
    "select_window",
    "select_windows",
    "summarizing_trim",
]

KNOWN_MAX: int
MAX_VALUE: int
ROLE_CODES: dict[str, int]

@disjoint_base
class Records:
    """One prompt's records, extended in place (see ``_filter_core_py.Records``)."""

    @property
    def n(self) -> int: ...
    @property
    def version(self) -> int: ...
    def __init__(self, message_type: type = ...) -> None: ...
    @property
    def msgs(self) -> list[Any]: ...
    @property
    def roles(self) -> npt.NDArray[np.int8]: ...
    @property
    def counts(self) -> npt.NDArray[np.int64]: ...
    @property
    def call_off(self) -> npt.NDArray[np.int64]: ...
    @property
    def call_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def result_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def interned(self) -> int: ...
    def match(self, msgs: list[Any]) -> int: ...
    def hint(self, msgs: list[Any], patched: list[int], originals: list[Any],
             counts: Optional[list[int]] = None) -> None: ...
    def advance(self, msgs: list[Any], count: Callable[[list[Any]], Sequence[int]]) -> int: ...
    def extend(self, new: list[Any], counts: Optional[Sequence[int]] = None) -> None: ...
    def truncate(self, k: int) -> None: ...
    def set_counts(self, index: Sequence[int], values: Sequence[int]) -> None: ...
    def plan(
        self, budget: int, pinned_mask: int, from_start: bool, chunk: int = 0, pinned_free: bool = False
    ) -> tuple[int, int, int, int]: ...
    def window(
        self,
        msgs: list[Any],
        count: Callable[[list[Any]], Sequence[int]],
        budget: int,
        settings: tuple[int, bool, int, bool],
        sanitize: bool,
        insert: Optional[tuple[Any, int, int]] = None,
        known: Optional[tuple[Any, ...]] = None,
    ) -> Optional[tuple[Any, ...]]: ...
    def sanitize(self, n_pinned: int, lo: int, hi: int) -> int: ...
    def joined(self, values: dict[int, bytes], lo: int, hi: int) -> Optional[bytes]: ...
    def fold_keys(
        self, lo: int, first: int, hi: int, acc: int, units: int, level: int, fold: int, key: bytes,
        known: Optional[bytes], values: dict[int, bytes],
    ) -> Optional[tuple[list[tuple[int, int, int, bytes]], int, int]]: ...
    def folds(
        self, lo: int, hi: int, acc: int, units: int, level: int, fold: int
    ) -> Optional[tuple[list[tuple[int, int, int]], int, int]]: ...
    def fold_step(
        self, chain: tuple[Any, ...], a: int, b: int, fold: int, values: dict[int, bytes],
        by_content: dict[bytes, str],
    ) -> Optional[tuple[Any, ...]]: ...

def select_window(
    counts: npt.NDArray[np.int64],  # const int64_t[::1]
    unit_starts: npt.NDArray[np.int64],  # const int64_t[::1]
    n_pinned: int,
    budget: int,
    from_start: bool,
    chunk: int = 0,
) -> tuple[int, int]: ...
def select_windows(
    counts: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    unit_starts: npt.NDArray[np.int64],
    unit_offsets: npt.NDArray[np.int64],
    n_pinned: npt.NDArray[np.int64],
    budgets: npt.NDArray[np.int64],
    from_start: bool,
    chunk: int = 0,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
def plan_window(
    roles: npt.NDArray[np.int8],  # const int8_t[::1]
    counts: npt.NDArray[np.int64],  # const int64_t[::1], -1 where not counted
    pinned_mask: int,
    budget: int,
    from_start: bool,
    chunk: int = 0,
    pinned_free: bool = False,
) -> tuple[int, int, int, int]: ...
def plan_windows(
    rows: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    roles: npt.NDArray[np.int8],
    counts: npt.NDArray[np.int64],
    pinned_mask: int,
    budget: int,
    from_start: bool,
    chunk: int = 0,
    pinned_free: bool = False,
) -> npt.NDArray[np.int64]: ...
def sanitize_window(
    roles: npt.NDArray[np.int8],
    call_off: npt.NDArray[np.int64],
    call_ids: npt.NDArray[np.int64],
    result_ids: npt.NDArray[np.int64],
    n_pinned: int,
    lo: int,
    hi: int,
) -> tuple[int, list[tuple[int, int]]]: ...
def sanitize_windows(
    rows: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    roles: npt.NDArray[np.int8],
    call_off: npt.NDArray[np.int64],
    call_ids: npt.NDArray[np.int64],
    result_ids: npt.NDArray[np.int64],
    n_pinned: npt.NDArray[np.int64],
    lo: npt.NDArray[np.int64],
    hi: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]: ...
def counts_of(counter: Any, ms: Sequence[Any], where: str = "messages") -> list[int]: ...

def summarizing_trim(flt: Any, messages: Any, tools_schema: Any, sanitize: bool) -> tuple[list[Any], bool]: ...
