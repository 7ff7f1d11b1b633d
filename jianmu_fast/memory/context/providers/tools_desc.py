"""``ToolsDescProvider``: the tool descriptions, wrapped in a template, as a system message."""

from __future__ import annotations

from typing import Any, Optional

from ....config.prompts import DEFAULT_TOOLS_PROMPT_TEMPLATE as DEFAULT_TOOLS_TEMPLATE
from ....config.prompts import tools_prompt_template
from ....message import Message, system

__all__ = ["ToolsDescProvider", "DEFAULT_TOOLS_TEMPLATE", "format_tools_prompt"]


def format_tools_prompt(tools_desc: str, template: Optional[str] = None) -> str:
    """Render ``tools_desc`` with ``template`` (default: the configured tools template).

    >>> format_tools_prompt("- calc", "Tools:\\n{tools_desc}")
    'Tools:\\n- calc'
    """
    tpl = template if template is not None else tools_prompt_template()
    if "{tools_desc}" not in tpl:
        raise ValueError(f"template must contain '{{tools_desc}}', got {tpl!r}")
    return tpl.replace("{tools_desc}", tools_desc)


class ToolsDescProvider:
    """Embed a pre-formatted tool description block in one system message.

    >>> provider = ToolsDescProvider("- calculator: perform arithmetic\\n- search: web search")
    >>> provider.get_messages({})[0].content
    'Available tools:\\n- calculator: perform arithmetic\\n- search: web search'
    """

    def __init__(self, tools_desc: str, template: Optional[str] = None) -> None:
        if not isinstance(tools_desc, str):
            raise TypeError(f"tools_desc: expected a str, got {type(tools_desc).__name__}")
        if template is not None and not isinstance(template, str):
            raise TypeError(f"template: expected a str or None, got {type(template).__name__}")
        self.tools_desc = tools_desc
        self.template = template
        self._message: Optional[Message] = None

    def __repr__(self) -> str:
        return f"ToolsDescProvider({self.tools_desc[:40]!r}{'...' if len(self.tools_desc) > 40 else ''})"

    def get_messages(self, local_state: Any, global_state: Any = None, ctx: Any = None) -> list[Message]:
        """Return ``[system(template.format(tools_desc))]``, or nothing for an empty description."""
        if not self.tools_desc.strip():
            return []
        if self._message is None:  # rendered on first use, so configuration errors reach the caller
            self._message = system(format_tools_prompt(self.tools_desc, self.template))
        return [self._message]
