"""``PromptRuntimeContext``: per-run prompt overrides, and ``RunContext`` that carries it.

A node receives a ``RunContext`` and reads ``ctx.prompt_runtime``. The presets and
:func:`~jianmu_fast.memory.context.resolve_for_llm` consume its fields:

- ``context_builder`` wins over any preset;
- ``workspace_dir`` and ``include_bootstrap_files`` are honoured by every preset;
- ``skills_catalog``, ``skills_dir``, ``include_skills_summary`` and
  ``include_active_skills`` are honoured only on the skill path (``for_skill``, or
  ``resolve_for_llm(allow_skill_context=True)``); ``for_chat`` and ``for_react`` ignore them.

Every switch defaults to off, so an empty ``PromptRuntimeContext()`` changes nothing.

>>> rp = PromptRuntimeContext(workspace_dir="/srv/ws", include_bootstrap_files=True)
>>> RunContext(prompt_runtime=rp).prompt_runtime.workspace_dir
'/srv/ws'
>>> rp.requests_skills()
False
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

__all__ = ["PromptRuntimeContext", "RunContext", "prompt_runtime_of"]


def _opt_dir(name: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"PromptRuntimeContext.{name}: expected a str, a path or None, got {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise ValueError(f"PromptRuntimeContext.{name}: expected a non-empty directory path, got {value!r}")
    return text


@dataclass(frozen=True)
class PromptRuntimeContext:
    """Run-time prompt overrides (the design document's seven fields).

    >>> PromptRuntimeContext(skills_dir="skills").requests_skills()
    True
    """

    context_builder: Any = None
    """A ready builder (``ContextBuilderProtocol``); when set, it is used as is."""
    skills_dir: Optional[str] = None
    """Directory of skill folders (each with a ``SKILL.md``); a path or str, stored as str."""
    workspace_dir: Optional[str] = None
    """Workspace root for ``BootstrapFilesProvider`` (default: config ``paths.workspace_dir``, then cwd)."""
    skills_catalog: Any = None
    """A loaded ``SkillsCatalog`` (or a list of ``Skill``); beats ``skills_dir``."""
    include_skills_summary: bool = False
    """Render the skill index (summary or full, as the preset's ``mode`` says)."""
    include_active_skills: bool = False
    """Render ``# Active Skills``: the instructions of the ``always: true`` skills."""
    include_bootstrap_files: bool = False
    """Add ``BootstrapFilesProvider`` (workspace files such as ``AGENTS.md``)."""

    def __post_init__(self) -> None:
        for name in ("skills_dir", "workspace_dir"):
            object.__setattr__(self, name, _opt_dir(name, getattr(self, name)))
        for name in ("include_skills_summary", "include_active_skills", "include_bootstrap_files"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"PromptRuntimeContext.{name}: expected a bool, got {type(getattr(self, name)).__name__}"
                )
        cb = self.context_builder
        if cb is not None and not callable(getattr(cb, "build", None)):
            raise TypeError(
                "PromptRuntimeContext.context_builder: expected a ContextBuilderProtocol "
                f"(build(local_state, ...)), got {type(cb).__name__}"
            )

    def requests_skills(self) -> bool:
        """Whether any skill field is set (what ``resolve_for_llm`` calls a skill request).

        >>> PromptRuntimeContext(include_bootstrap_files=True).requests_skills()
        False
        """
        return (
            self.skills_catalog is not None
            or self.skills_dir is not None
            or self.include_skills_summary
            or self.include_active_skills
        )


@dataclass
class RunContext:
    """A minimal run context: what the builder passes to providers as ``ctx``.

    Providers look for ``ctx.prompt_runtime`` (an attribute, or a ``"prompt_runtime"`` key
    when ``ctx`` is a mapping). ``extras`` holds anything else a caller wants to carry.

    >>> RunContext().prompt_runtime is None
    True
    """

    prompt_runtime: Optional[PromptRuntimeContext] = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.prompt_runtime is not None and not isinstance(self.prompt_runtime, PromptRuntimeContext):
            raise TypeError(
                f"RunContext.prompt_runtime: expected a PromptRuntimeContext or None, "
                f"got {type(self.prompt_runtime).__name__}"
            )


def prompt_runtime_of(ctx: Any) -> Optional[PromptRuntimeContext]:
    """``ctx.prompt_runtime`` (attribute or mapping key), or ``None`` when absent.

    >>> prompt_runtime_of({"prompt_runtime": PromptRuntimeContext(workspace_dir="w")}).workspace_dir
    'w'
    >>> prompt_runtime_of(None) is None
    True
    """
    if ctx is None:
        return None
    if isinstance(ctx, PromptRuntimeContext):
        return ctx
    if isinstance(ctx, Mapping):
        rp = ctx.get("prompt_runtime")
    else:
        rp = getattr(ctx, "prompt_runtime", None)
    return rp if isinstance(rp, PromptRuntimeContext) else None
