"""Configuration: built-in prompt texts and their ``jianmu.yaml`` overrides.

>>> from jianmu_fast.config import prompts
>>> prompts.persona_default_prompt()
'You are a helpful assistant.'
"""

from . import prompts

__all__ = ["prompts"]
