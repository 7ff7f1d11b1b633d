"""How many examples the property tests run: ``JIANMU_FAST_EXAMPLES_SCALE`` (default 1).

Every hypothesis test runs this fraction of its ``max_examples``, at least one (``conftest.py``
applies it at collection). ``make test`` runs the compiled suite at 0.5 and the pure-Python one
at 0.25 (the compiled run proves each compiled routine equal to its pure twin; the pure run
proves the pure backend behaves): both fit CI's 2 cores side by side.
"""

from __future__ import annotations

import os

EXAMPLES_SCALE = float(os.environ.get("JIANMU_FAST_EXAMPLES_SCALE", "1"))


def scaled_examples(n: int) -> int:
    """``n`` examples scaled by ``JIANMU_FAST_EXAMPLES_SCALE``, at least one."""
    return max(1, round(n * EXAMPLES_SCALE))
