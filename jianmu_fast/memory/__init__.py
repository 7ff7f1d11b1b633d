"""Memory: context building (``jianmu_fast.memory.context``)."""
