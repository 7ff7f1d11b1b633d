"""Type stubs of the compiled context-editing core (``csrc/_editing_core.pyx``)."""

from typing import Any

MAX_VALUE: int

def plan_clearing(counts: Any, kinds: Any, savings: Any, base: int, trigger: int, step: int,
                  keep: int) -> tuple[int, int]: ...
