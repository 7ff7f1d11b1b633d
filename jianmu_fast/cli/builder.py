"""The prompts' builder of the command: the preset and options of the command line, with the
input's own persona in place of the preset's."""

from __future__ import annotations

import argparse
import os
from typing import Any, Sequence

from .common import UsageError, read_text

__all__ = ["InputPersonaProvider", "split_persona", "make_builder"]


class InputPersonaProvider:
    """The persona of a command-line prompt: the state's ``"persona"`` messages (the input
    line's leading system messages) when it has any, else those of ``default`` (the preset's
    persona provider: ``--system-prompt``, or the configured default persona). Never both.

    >>> from jianmu_fast.memory.context import StaticPromptProvider
    >>> from jianmu_fast.message import system
    >>> p = InputPersonaProvider(StaticPromptProvider("You are a helpful assistant."))
    >>> [m.content for m in p.get_messages({"messages": [], "persona": [system("You are Jianmu.")]})]
    ['You are Jianmu.']
    >>> [m.content for m in p.get_messages({"messages": []})]
    ['You are a helpful assistant.']
    """

    def __init__(self, default: Any) -> None:
        self.default = default

    def __repr__(self) -> str:
        return f"InputPersonaProvider({self.default!r})"

    def get_messages(self, local_state: Any, global_state: Any = None, ctx: Any = None) -> list[Any]:
        persona = local_state.get("persona") if isinstance(local_state, dict) else None
        if persona:
            return list(persona)
        return list(self.default.get_messages(local_state, global_state, ctx))


def split_persona(messages: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """``(leading system messages, the rest)`` of an input conversation.

    >>> from jianmu_fast.message import system, human
    >>> [[m.content for m in part] for part in split_persona([system("a"), system("b"), human("c"), system("d")])]
    [['a', 'b'], ['c', 'd']]
    """
    k = 0
    while k < len(messages) and messages[k].role == "system":
        k += 1
    return list(messages[:k]), list(messages[k:])


def make_builder(args: argparse.Namespace, counter: Any) -> Any:
    """The ``ContextBuilder`` of the preset and options in ``args``.

    >>> from jianmu_fast.cli import make_counter, make_parser
    >>> ns = make_parser().parse_args(["build", "-", "--preset", "react", "--max-tokens", "500"])
    >>> b = make_builder(ns, make_counter("simple"))
    >>> [type(p).__name__ for p in b.providers], [type(f).__name__ for f in b.filters]
    (['InputPersonaProvider', 'StaticPromptProvider', 'StateHistoryProvider'], ['TokenBudgetFilter'])
    >>> ns = make_parser().parse_args(["build", "-", "--max-tokens", "8000", "--tool-result-max-tokens", "2000",
    ...                                "--clear-tool-results", "3"])
    >>> [type(f).__name__ for f in make_builder(ns, make_counter("simple")).filters]
    ['ToolResultCapFilter', 'ClearToolResultsFilter', 'TokenBudgetFilter']
    """
    from ..memory.context import ContextBuilder, PromptRuntimeContext

    system_prompt = args.system_prompt
    if args.system_prompt_file is not None:
        system_prompt = read_text(args.system_prompt_file, "--system-prompt-file")
    tools_desc = getattr(args, "tools_desc", None)
    if args.tools_desc_file:
        tools_desc = read_text(args.tools_desc_file, "--tools-desc-file")
    if args.skills_dir is not None and args.preset != "skill":
        raise UsageError("--skills-dir needs --preset skill (the chat and react presets ignore skills)")
    if tools_desc is not None and args.preset == "chat":
        raise UsageError("--tools-desc-file needs --preset react or skill (the chat preset has no tools)")
    for flag, d in (("--skills-dir", args.skills_dir), ("--workspace-dir", args.workspace_dir)):
        if d is not None and not os.path.isdir(d):
            raise UsageError(f"{flag} {d!r}: not a directory")
    runtime = None
    if args.workspace_dir is not None or args.skills_dir is not None:
        runtime = PromptRuntimeContext(
            workspace_dir=args.workspace_dir,
            include_bootstrap_files=args.workspace_dir is not None,
            skills_dir=args.skills_dir,
        )
    common = dict(system_prompt=system_prompt, max_messages=args.max_messages, max_tokens=args.max_tokens,
                  runtime_prompt=runtime, token_counter=counter)
    editing = dict(tool_result_max_tokens=getattr(args, "tool_result_max_tokens", None),
                   clear_tool_results=getattr(args, "clear_tool_results", None))
    if editing["clear_tool_results"] is not None and args.max_tokens is None:
        raise UsageError("--clear-tool-results clears once a prompt is over --max-tokens: pass --max-tokens too")
    if args.preset == "chat":
        preset = ContextBuilder.for_chat(**common)
    elif args.preset == "react":
        preset = ContextBuilder.for_react(**common, tools_desc=tools_desc, **editing)
    else:
        preset = ContextBuilder.for_skill(**common, tools_desc=tools_desc)
    filters = preset.filters
    if args.preset != "react":  # the react preset adds the context-editing stages itself
        from ..memory.context.presets import _editing_filters

        filters = _editing_filters(filters, args.max_tokens, counter, summarize=None, **editing)
    # every preset starts with its persona provider; the input's own persona takes its place
    providers = [InputPersonaProvider(preset.providers[0]), *preset.providers[1:]]
    return ContextBuilder(providers=providers, filters=filters, sanitize=preset.sanitize)
