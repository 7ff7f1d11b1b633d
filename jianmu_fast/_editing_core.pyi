"""Type stubs of the compiled context-editing core (``csrc/_editing_core.pyx``)."""

from typing import Any, Optional

__all__ = ["MAX_VALUE", "STATE_LEN", "extends", "plan_clearing"]

MAX_VALUE: int
STATE_LEN: int

def plan_clearing(counts: Any, kinds: Any, savings: Any, base: int, trigger: int, step: int,
                  keep: int, state: Optional[Any] = None) -> tuple[int, int]: ...
def extends(previous: list[Any], current: list[Any]) -> bool: ...
