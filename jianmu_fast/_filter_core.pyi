import numpy as np
import numpy.typing as npt

__all__ = ["MAX_VALUE", "select_window", "select_windows"]

MAX_VALUE: int

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
