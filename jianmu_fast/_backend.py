"""The only module that imports the filter core, and the one place that names the backend.

``JIANMU_FAST_PURE_PYTHON=1`` selects the pure-Python reference; otherwise the compiled
extension must import, and a missing one is an ImportError that says how to fix it.
"""

from __future__ import annotations

import os
from typing import Any, Literal

BACKEND: Literal["cython", "python"]

if os.environ.get("JIANMU_FAST_PURE_PYTHON") == "1":
    from ._filter_core_py import (  # noqa: F401
        MAX_VALUE, ROLE_CODES, Records, counts_of, plan_window, plan_windows, sanitize_window, sanitize_windows, select_window,
        select_windows, summarizing_trim,
    )
    from ._editing_core_py import ClearingTurn, cap_hot_apply, clearing_turn, extend_capped, extends, place_cleared, plan_clearing
    from ._batch_core_py import gather_rows, group_states, intern_rows, need_rows, pack_rows, prefix_groups, table_records, text_sides

    BACKEND = "python"
else:
    try:
        from ._filter_core import (  # type: ignore[assignment]  # noqa: F401  (Records: the twin's class)
            MAX_VALUE, ROLE_CODES, Records, counts_of, plan_window, plan_windows, sanitize_window, sanitize_windows, select_window,
            select_windows, summarizing_trim,
        )
        from ._editing_core import (  # type: ignore[assignment]  # noqa: F401  (ClearingTurn: the twin's class)
            ClearingTurn, cap_hot_apply, clearing_turn, extend_capped, extends, place_cleared, plan_clearing,
        )
        from ._batch_core import gather_rows, group_states, intern_rows, need_rows, pack_rows, prefix_groups, table_records, text_sides
    except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
        raise ImportError(
            "jianmu_fast._filter_core is not compiled: run `pip install -e .` (or `make install`) "
            "in the source tree, or set JIANMU_FAST_PURE_PYTHON=1 for the pure-Python reference"
        ) from exc
    BACKEND = "cython"



def template_core() -> Any:
    """The hot path of ``ChatTemplateTokenCounter``: the compiled ``_template_core``, or its
    twin ``_template_core_py`` under ``JIANMU_FAST_PURE_PYTHON=1``. Imported on first use (by
    ``memory.context.chat_template``): the filter cores' users never load it."""
    if BACKEND == "python":
        from . import _template_core_py as core
    else:
        try:
            from . import _template_core as core  # type: ignore[no-redef]
        except ImportError as exc:  # pragma: no cover - a build without the new extension
            raise ImportError(
                "jianmu_fast._template_core is not compiled: run `pip install -e .` (or `make install`) "
                "in the source tree, or set JIANMU_FAST_PURE_PYTHON=1 for the pure-Python reference"
            ) from exc
    return core


__all__ = ["BACKEND", "MAX_VALUE", "Records", "plan_clearing", "select_window", "select_windows", "template_core"]
