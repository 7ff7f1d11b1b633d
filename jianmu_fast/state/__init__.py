"""Agent state that survives a crash: :class:`StateManager` (memory or SQLite backend).

>>> from jianmu_fast.state import StateManager
>>> sm = StateManager()
>>> sm.set("step", 1); sm.get("step")
1
"""

from ..errors import StateStoreError
from .manager import RetentionPolicy, StateManager

__all__ = ["StateManager", "RetentionPolicy", "StateStoreError"]
