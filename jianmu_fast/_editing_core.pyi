"""Type stubs of the compiled context-editing core (``csrc/_editing_core.pyx``)."""

from typing import Any, Optional

__all__ = ["MAX_VALUE", "STATE_LEN", "TURN_MAX", "clearing_turn", "extend_capped", "extends", "plan_clearing"]

MAX_VALUE: int
STATE_LEN: int
TURN_MAX: int

def plan_clearing(counts: Any, kinds: Any, savings: Any, base: int, trigger: int, step: int,
                  keep: int, state: Optional[Any] = None) -> tuple[int, int]: ...
def extends(previous: list[Any], current: list[Any]) -> bool: ...
def extend_capped(src: list[Any], ref: list[Any], out: list[Any], cache: dict[int, Any]) -> int: ...
def clearing_turn(src: list[Any], ref: list[Any], out: list[Any], counts: Any, kinds: Any, savings: Any,
                  results: list[int], result_kinds: list[int], state: Any, counter: Any,
                  settings: tuple[int, int, int, int]) -> int: ...
