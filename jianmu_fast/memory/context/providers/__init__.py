"""The message providers, one module each."""

from .bootstrap_files import BootstrapFilesProvider
from .skill_set import SkillSetPromptProvider
from .state_history import StateHistoryProvider
from .static_prompt import StaticPromptProvider
from .tools_desc import ToolsDescProvider

__all__ = ["StaticPromptProvider", "ToolsDescProvider", "BootstrapFilesProvider", "SkillSetPromptProvider", "StateHistoryProvider"]
