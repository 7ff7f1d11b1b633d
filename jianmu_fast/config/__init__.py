"""Configuration: prompt texts, paths and constraints, with ``jianmu.yaml`` overrides.

See :mod:`jianmu_fast.config.loader` for where the file is found and what it may hold.

>>> from jianmu_fast.config import prompts, Constraints
>>> prompts.persona_default_prompt()
'You are a helpful assistant.'
>>> Constraints.load().max_messages is None
True
"""

from . import prompts
from .constraints import Constraints
from .loader import (
    JianmuConfig,
    JianmuConfigWarning,
    clear_config_cache,
    config_path,
    load_config,
    reload_config,
)

__all__ = [
    "prompts",
    "Constraints",
    "JianmuConfig",
    "JianmuConfigWarning",
    "config_path",
    "load_config",
    "reload_config",
    "clear_config_cache",
]
