"""jianmu_fast: prompt assembly for LLM agents with a compiled, transaction-safe trimming core.

>>> import jianmu_fast
>>> jianmu_fast.BACKEND in ("cython", "python")
True
"""

from ._backend import BACKEND
from .errors import (
    BatchError,
    ConfigError,
    ContextBudgetError,
    JianmuError,
    MaxStepsExceededError,
    MessageValidationError,
    ModelCallError,
    StateStoreError,
    TokenizerLoadError,
    ToolCallHistoryError,
)
from .prefix_cache import PrefixCacheStats, prefix_cache_stats

__version__ = "0.1.0"

__all__ = [
    "BACKEND",
    "__version__",
    "JianmuError",
    "MessageValidationError",
    "ContextBudgetError",
    "ToolCallHistoryError",
    "ConfigError",
    "TokenizerLoadError",
    "StateStoreError",
    "BatchError",
    "ModelCallError",
    "MaxStepsExceededError",
    "PrefixCacheStats",
    "prefix_cache_stats",
]
