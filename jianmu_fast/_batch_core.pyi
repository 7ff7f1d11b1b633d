"""Type stubs of the compiled batch core (``csrc/_batch_core.pyx``); the semantics are those
of the pure-Python twin ``jianmu_fast._batch_core_py``."""

from typing import Any, Optional, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["intern_rows", "need_rows", "prefix_prompts", "slice_outputs", "table_records"]

def intern_rows(prompts: Sequence[Any], cls: type) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], list[Any], list[int]]: ...
def table_records(distinct: Sequence[Any], role_codes: dict[str, int]) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
def need_rows(rows: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64], plans: npt.NDArray[np.int64],
              counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]: ...
def slice_outputs(prompts: Sequence[list[Any]], plans: npt.NDArray[np.int64]) -> list[list[Any]]: ...
def prefix_prompts(head: list[Any], note_head: list[Any], tail: list[Any], hist: list[Any], base: list[Any],
                   srcs: Sequence[Any]) -> list[Optional[list[Any]]]: ...
