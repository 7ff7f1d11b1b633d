"""``SkillSetPromptProvider``: a skill set rendered as one system message.

Three renderings, all deterministic (the same skills and tools give the same bytes):

``mode="summary"`` with a file-reading tool in the request's ``tools_schema``::

    # Skills
    <skill_capability_policy_prompt>
    Available skills:
    - <name>: <description>
      SKILL.md: <path>
    <skill_on_demand_policy_prompt>

``mode="summary"`` without one: the index (no paths), ``skill_fallback_policy_prompt``, then
``Skill instructions:`` with every skill's instructions inlined, as in full mode.

``mode="full"``: the index, then ``Skill instructions:`` and one ``## <name>`` block per skill
(its instructions, then ``Resources: ...`` when it has files beside ``SKILL.md``).

``always_only=True``: only ``# Active Skills`` and the blocks of the ``always: true`` skills.

Wherever instructions are inlined and a skill has resources or a runtime directory mapping
is given, the message ends with ``skill_resource_usage_policy_prompt`` and ``Skill
directories:``, one line per skill: where its directory is visible at run time
(``resource_paths[name]``, else ``resource_root/<directory name>``, else its local directory).
The ``SKILL.md`` paths of the index use the same mapping.

All texts come from :mod:`jianmu_fast.config.prompts` and are read when the message is first
rendered, so a broken ``jianmu.yaml`` raises ``ConfigError`` to the caller.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Literal, Mapping, Optional, Sequence

from ....config import prompts
from ....message import Message, system
from ....skills.catalog import as_skill_list
from ....skills.skill import SKILL_FILE, Skill

__all__ = ["SkillSetPromptProvider", "DEFAULT_FILE_READ_TOOLS", "tool_names"]

DEFAULT_FILE_READ_TOOLS: tuple[str, ...] = (
    "read_file",
    "read_text_file",
    "file_read",
    "view_file",
    "open_file",
    "read",
)
_MAX_LISTED_RESOURCES = 50


def tool_names(tools_schema: Optional[Iterable[Any]]) -> list[str]:
    """Names of the tools in ``tools_schema``: OpenAI ``{"type": "function", "function":
    {"name": ...}}``, a bare ``{"name": ...}``, or an object with a ``name`` attribute.

    >>> tool_names([{"type": "function", "function": {"name": "read_file"}}, {"name": "calc"}])
    ['read_file', 'calc']
    """
    out: list[str] = []
    for t in tools_schema or ():
        name: Any = None
        if isinstance(t, Mapping):
            fn = t.get("function")
            name = fn.get("name") if isinstance(fn, Mapping) else t.get("name")
        else:
            name = getattr(t, "name", None)
        if isinstance(name, str):
            out.append(name)
    return out


class SkillSetPromptProvider:
    """Render a skill set (a ``SkillsCatalog`` or a list of ``Skill``) as a system message.

    >>> from jianmu_fast.skills import Skill
    >>> p = SkillSetPromptProvider([Skill("greet", "Say hello.", "Be warm.", path="/s/greet/SKILL.md")])
    >>> text = p.get_messages({}, tools_schema=[{"type": "function", "function": {"name": "read_file"}}])[0].content
    >>> print(text.split("\\n\\n")[2])
    Available skills:
    - greet: Say hello.
      SKILL.md: /s/greet/SKILL.md
    >>> "Be warm." in p.get_messages({})[0].content   # no file tool: instructions inlined
    True
    """

    def __init__(
        self,
        skill_set: Any,
        mode: Literal["summary", "full"] = "summary",
        always_only: bool = False,
        file_read_tools: Sequence[str] = DEFAULT_FILE_READ_TOOLS,
        *,
        resource_root: Optional[str | os.PathLike[str]] = None,
        resource_paths: Optional[Mapping[str, str]] = None,
    ) -> None:
        if mode not in ("summary", "full"):
            raise ValueError(f"mode must be 'summary' or 'full', got {mode!r}")
        if not isinstance(always_only, bool):
            raise TypeError(f"always_only: expected a bool, got {type(always_only).__name__}")
        if isinstance(file_read_tools, str) or not all(isinstance(n, str) and n for n in file_read_tools):
            raise TypeError(f"file_read_tools: expected a list of tool names, got {file_read_tools!r}")
        if resource_root is not None and not isinstance(resource_root, (str, os.PathLike)):
            raise TypeError(f"resource_root: expected a str or None, got {type(resource_root).__name__}")
        if resource_paths is not None:
            if not isinstance(resource_paths, Mapping):
                raise TypeError(f"resource_paths: expected a mapping of skill name to path, got {type(resource_paths).__name__}")
            for k, v in resource_paths.items():
                if not isinstance(v, (str, os.PathLike)):
                    raise TypeError(f"resource_paths[{k!r}]: expected a path string, got {type(v).__name__}")
        self.skills: list[Skill] = as_skill_list(skill_set)
        self.mode = mode
        self.always_only = always_only
        self.file_read_tools = tuple(file_read_tools)
        self.resource_root = None if resource_root is None else os.fspath(resource_root)
        self.resource_paths = {k: os.fspath(v) for k, v in (resource_paths or {}).items()}
        self._cache: dict[bool, list[Message]] = {}

    def __repr__(self) -> str:
        return (f"SkillSetPromptProvider({[s.name for s in self.skills]!r}, mode={self.mode!r}, "
                f"always_only={self.always_only})")

    def has_file_tool(self, tools_schema: Optional[Iterable[Any]]) -> bool:
        """Whether ``tools_schema`` names one of ``file_read_tools``.

        >>> SkillSetPromptProvider([]).has_file_tool([{"name": "read_file"}])
        True
        """
        return any(n in self.file_read_tools for n in tool_names(tools_schema))

    def get_messages(
        self,
        local_state: Any,
        global_state: Any = None,
        ctx: Any = None,
        tools_schema: Optional[Sequence[Any]] = None,
    ) -> list[Message]:
        """The skill message for this request (``[]`` when there is nothing to show)."""
        key = self.mode == "summary" and not self.always_only and self.has_file_tool(tools_schema)
        cached = self._cache.get(key)
        if cached is None:
            text = self.render(on_demand=key)
            cached = [system(text)] if text else []
            self._cache[key] = cached
        return list(cached)

    # -- rendering ----------------------------------------------------------------------------

    def render(self, on_demand: bool) -> str:
        """The message text; ``on_demand`` (summary mode only): a file-reading tool exists.

        >>> from jianmu_fast.skills import Skill
        >>> print(SkillSetPromptProvider([Skill("a", "A.", "Do A.", always=True)], always_only=True).render(False))
        # Active Skills
        <BLANKLINE>
        ## a
        <BLANKLINE>
        Do A.
        """
        if self.always_only:
            active = [s for s in self.skills if s.always]
            if not active:
                return ""
            return "\n\n".join(["# Active Skills", *self._blocks(active), *self._resource_section(active)])
        if not self.skills:
            return ""
        parts = ["# Skills", prompts.skill_capability_policy_prompt(), self._index(with_paths=on_demand)]
        if on_demand:
            parts.append(prompts.skill_on_demand_policy_prompt())
            return "\n\n".join(parts)
        if self.mode == "summary":
            parts.append(prompts.skill_fallback_policy_prompt())
        parts.append("Skill instructions:")
        parts.extend(self._blocks(self.skills))
        parts.extend(self._resource_section(self.skills))
        return "\n\n".join(parts)

    def _runtime_dir(self, skill: Skill) -> Optional[str]:
        if skill.name in self.resource_paths:
            return self.resource_paths[skill.name]
        if skill.directory is None:
            return None
        if self.resource_root is not None:
            return f"{self.resource_root.rstrip('/')}/{skill.directory.name}"
        return str(skill.directory)

    def _index(self, with_paths: bool) -> str:
        lines = ["Available skills:"]
        for s in self.skills:
            kind = " (type: bt)" if s.type == "bt" else ""
            lines.append(f"- {s.name}{kind}: {s.description}")
            d = self._runtime_dir(s) if with_paths else None
            if d is not None:
                lines.append(f"  {SKILL_FILE}: {d.rstrip('/')}/{SKILL_FILE}")
        return "\n".join(lines)

    @staticmethod
    def _blocks(skills: list[Skill]) -> list[str]:
        blocks = []
        for s in skills:
            kind = " (type: bt)" if s.type == "bt" else ""
            block = f"## {s.name}{kind}\n\n{s.instructions or s.description}"
            if s.resources:
                shown = list(s.resources[:_MAX_LISTED_RESOURCES])
                more = len(s.resources) - len(shown)
                block += "\n\nResources: " + ", ".join(shown) + (f", and {more} more" if more else "")
            blocks.append(block)
        return blocks

    def _resource_section(self, skills: list[Skill]) -> list[str]:
        mapped = bool(self.resource_paths) or self.resource_root is not None
        if not mapped and not any(s.resources for s in skills):
            return []
        lines = ["Skill directories:"]
        for s in skills:
            d = self._runtime_dir(s)
            if d is not None and (mapped or s.resources):
                lines.append(f"- {s.name}: {d}")
        if len(lines) == 1:
            return []
        return [prompts.skill_resource_usage_policy_prompt(), "\n".join(lines)]
