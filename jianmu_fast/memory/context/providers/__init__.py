"""The message providers, one module each."""

from .static_prompt import StaticPromptProvider
from .tools_desc import ToolsDescProvider

__all__ = ["StaticPromptProvider", "ToolsDescProvider"]
