"""The three preset builders and ``resolve_for_llm``, which picks one.

Provider chains (the design document's "工厂预设"; ``[...]`` marks an optional provider)::

    for_chat   Static(persona) → [Bootstrap] → StateHistory
    for_react  Static(persona) → Static(react_protocol) → [ToolsDesc] → [Bootstrap] → StateHistory
    for_skill  Static(persona) → [Static(react_protocol)] → [ToolsDesc] → [Bootstrap]
               → SkillSet (one or two) → StateHistory

- ``persona`` is ``system_prompt``, default ``prompt.persona_default_prompt`` of the config;
  ``react_protocol`` is ``prompt.react_protocol_prompt``.
- ``ToolsDesc`` is added when ``tools_desc`` is a non-blank string. ``for_skill`` accepts it
  too and puts it where ``for_react`` does, after the protocol it belongs to.
- ``Bootstrap`` is added when ``runtime_prompt.include_bootstrap_files`` is true, rooted at
  ``runtime_prompt.workspace_dir`` (else config ``paths.workspace_dir``, else the cwd).
- ``for_chat`` and ``for_react`` ignore the skill fields of ``PromptRuntimeContext``.
- ``for_skill``: the skills are ``skill_set`` when given, else
  ``SkillsCatalog.resolve_runtime(runtime_prompt)``. With neither
  ``include_skills_summary`` nor ``include_active_skills`` set, one
  ``SkillSetPromptProvider(skills, mode)``; otherwise one per switch that is on, the
  summary (in ``mode``) first, then ``always_only=True`` (``# Active Skills``).

Filters, in this order: ``MaxMessagesFilter(max_messages)`` then
``TokenBudgetFilter(max_tokens, counter=token_counter)``, each only when its limit is set.
``max_messages=None`` falls back to ``Constraints.max_messages`` of ``jianmu.yaml``.
``token_counter`` is used only with ``max_tokens``.

Configuration is read when a preset is built: a malformed ``jianmu.yaml`` raises
``ConfigError`` here, to the caller.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence

from ...config.constraints import Constraints
from ...config.prompts import persona_default_prompt, react_protocol_prompt
from ...skills.catalog import SkillsCatalog
from .builder import ContextBuilder
from .filters import MaxMessagesFilter, TokenBudgetFilter
from .providers.bootstrap_files import BootstrapFilesProvider
from .providers.skill_set import DEFAULT_FILE_READ_TOOLS, SkillSetPromptProvider
from .providers.static_prompt import StaticPromptProvider
from .providers.tools_desc import ToolsDescProvider
from .runtime import PromptRuntimeContext, prompt_runtime_of

__all__ = ["for_chat", "for_react", "for_skill", "resolve_for_llm"]

_SKILL_ONLY = frozenset({"skill_set", "mode", "include_react", "file_read_tools", "resource_root", "resource_paths"})


def _runtime(runtime_prompt: Any) -> Optional[PromptRuntimeContext]:
    if runtime_prompt is None:
        return None
    rp = prompt_runtime_of(runtime_prompt)
    if rp is None:
        raise TypeError(
            f"runtime_prompt: expected a PromptRuntimeContext (or a context carrying one as "
            f".prompt_runtime), got {type(runtime_prompt).__name__}"
        )
    return rp


def _history() -> Any:
    from .providers.state_history import StateHistoryProvider

    return StateHistoryProvider()


def _persona(system_prompt: Optional[str]) -> StaticPromptProvider:
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise TypeError(f"system_prompt: expected a str or None, got {type(system_prompt).__name__}")
    return StaticPromptProvider(persona_default_prompt() if system_prompt is None else system_prompt)


def _bootstrap(rp: Optional[PromptRuntimeContext]) -> list[Any]:
    if rp is None or not rp.include_bootstrap_files:
        return []
    return [BootstrapFilesProvider(workspace_dir=rp.workspace_dir)]


def _tools(tools_desc: Optional[str]) -> list[Any]:
    if tools_desc is None:
        return []
    if not isinstance(tools_desc, str):
        raise TypeError(f"tools_desc: expected a str or None, got {type(tools_desc).__name__}")
    return [ToolsDescProvider(tools_desc)] if tools_desc.strip() else []


def _filters(max_messages: Optional[int], max_tokens: Optional[int], token_counter: Any) -> list[Any]:
    if max_messages is None:
        max_messages = Constraints.load().max_messages
    out: list[Any] = []
    if max_messages is not None:
        out.append(MaxMessagesFilter(max_messages))
    if max_tokens is not None:
        out.append(TokenBudgetFilter(max_tokens, counter=token_counter))
    return out


def _editing_filters(filters: list[Any], max_tokens: Optional[int], token_counter: Any,
                     tool_result_max_tokens: Any, clear_tool_results: Any, summarize: Any) -> list[Any]:
    """``filters`` with the context-editing stages: cap and clear first, the summarizing budget
    in place of ``TokenBudgetFilter``. ``None`` arguments fall back to ``constraints.*`` of
    ``jianmu.yaml`` (used only with ``max_tokens`` for clearing)."""
    from .editing import ClearToolResultsFilter, SummarizingBudgetFilter, ToolResultCapFilter

    if tool_result_max_tokens is None or clear_tool_results is None:
        c = Constraints.load()
        if tool_result_max_tokens is None:
            tool_result_max_tokens = c.tool_result_max_tokens
        if clear_tool_results is None and max_tokens is not None:
            clear_tool_results = c.clear_tool_results
    pre: list[Any] = []
    if tool_result_max_tokens is not None:
        pre.append(ToolResultCapFilter(tool_result_max_tokens, token_counter))
    if clear_tool_results is not None:
        if isinstance(clear_tool_results, ClearToolResultsFilter):
            pre.append(clear_tool_results)
        else:
            if isinstance(clear_tool_results, Mapping):
                opts = dict(clear_tool_results)
            elif isinstance(clear_tool_results, int) and not isinstance(clear_tool_results, bool):
                opts = {"keep": clear_tool_results}
            else:
                raise TypeError("clear_tool_results: expected the number of newest results to keep (int), a dict of "
                                f"ClearToolResultsFilter options or a ClearToolResultsFilter, got {type(clear_tool_results).__name__}")
            trigger = opts.pop("trigger_tokens", max_tokens)
            if trigger is None:
                raise ValueError("clear_tool_results needs max_tokens= (the trigger) or a 'trigger_tokens' option")
            # steps of a quarter of the trigger: a step rewrites the prompt's middle (a prompt-cache
            # miss, and the budget filter's per-message records rebuilt), so take few of them
            opts.setdefault("clear_at_least", trigger // 4)
            pre.append(ClearToolResultsFilter(trigger, opts.pop("counter", token_counter), **opts))
    out = pre + filters
    if summarize is not None:
        if max_tokens is None:
            raise ValueError("summarize= summarizes what the token budget drops: pass max_tokens= too")
        out = [f for f in out if type(f) is not TokenBudgetFilter]
        # chunked eviction: the dropped span, and so the summary, changes once per move of the cut
        out.append(summarize if isinstance(summarize, SummarizingBudgetFilter)
                   else SummarizingBudgetFilter(max_tokens, token_counter, summarize=summarize,
                                                summary_max_tokens=max(1, min(512, max_tokens // 8)),
                                                eviction="chunked", chunk=max(1, max_tokens // 4)))
    return out


def for_chat(
    system_prompt: Optional[str] = None,
    max_messages: Optional[int] = None,
    max_tokens: Optional[int] = None,
    runtime_prompt: Optional[PromptRuntimeContext] = None,
    token_counter: Any = None,
    *,
    builder_cls: type = ContextBuilder,
) -> Any:
    """Plain chat: ``Static(persona) → [Bootstrap] → StateHistory``.

    >>> b = for_chat(system_prompt="You are a helpful assistant.", max_messages=50)
    >>> [type(p).__name__ for p in b.providers], [type(f).__name__ for f in b.filters]
    (['StaticPromptProvider', 'StateHistoryProvider'], ['MaxMessagesFilter'])
    """
    rp = _runtime(runtime_prompt)
    providers = [_persona(system_prompt), *_bootstrap(rp), _history()]
    return builder_cls(providers=providers, filters=_filters(max_messages, max_tokens, token_counter))


def for_react(
    system_prompt: Optional[str] = None,
    max_messages: Optional[int] = None,
    max_tokens: Optional[int] = None,
    runtime_prompt: Optional[PromptRuntimeContext] = None,
    token_counter: Any = None,
    tools_desc: Optional[str] = None,
    *,
    tool_result_max_tokens: Optional[int] = None,
    clear_tool_results: Any = None,
    summarize: Any = None,
    builder_cls: type = ContextBuilder,
) -> Any:
    """ReAct: ``Static(persona) → Static(react_protocol) → [ToolsDesc] → [Bootstrap] → StateHistory``.

    Context editing (``jianmu_fast.memory.context.editing``), each off by default:
    ``tool_result_max_tokens=N`` adds ``ToolResultCapFilter(N)`` first;
    ``clear_tool_results=KEEP`` adds ``ClearToolResultsFilter(max_tokens, keep=KEEP,
    clear_at_least=max_tokens // 4)`` (a dict of its options, or a filter, also works); ``summarize=`` (a callable or a ``ModelClient``)
    replaces ``TokenBudgetFilter`` by ``SummarizingBudgetFilter(max_tokens, summarize=...,
    summary_max_tokens=min(512, max_tokens // 8), eviction="chunked", chunk=max_tokens // 4)``
    (chunked: the dropped span, and so the summary, changes once per move of the cut, so a hot
    loop calls ``summarize`` about once per move, not on every turn).
    Unset, the first two come from ``constraints.*`` of ``jianmu.yaml``.

    >>> b = for_react(max_tokens=8000, tool_result_max_tokens=2000, clear_tool_results=3)
    >>> [type(f).__name__ for f in b.filters]
    ['ToolResultCapFilter', 'ClearToolResultsFilter', 'TokenBudgetFilter']

    >>> b = for_react(system_prompt="You are a math assistant.", tools_desc="- calculator: arithmetic")
    >>> [type(p).__name__ for p in b.providers]
    ['StaticPromptProvider', 'StaticPromptProvider', 'ToolsDescProvider', 'StateHistoryProvider']
    """
    rp = _runtime(runtime_prompt)
    providers = [
        _persona(system_prompt),
        StaticPromptProvider(react_protocol_prompt()),
        *_tools(tools_desc),
        *_bootstrap(rp),
        _history(),
    ]
    filters = _editing_filters(_filters(max_messages, max_tokens, token_counter), max_tokens, token_counter,
                               tool_result_max_tokens, clear_tool_results, summarize)
    return builder_cls(providers=providers, filters=filters)


def for_skill(
    system_prompt: Optional[str] = None,
    max_messages: Optional[int] = None,
    max_tokens: Optional[int] = None,
    runtime_prompt: Optional[PromptRuntimeContext] = None,
    token_counter: Any = None,
    skill_set: Any = None,
    mode: Literal["summary", "full"] = "summary",
    include_react: bool = True,
    tools_desc: Optional[str] = None,
    *,
    file_read_tools: Sequence[str] = DEFAULT_FILE_READ_TOOLS,
    resource_root: Optional[str] = None,
    resource_paths: Optional[Mapping[str, str]] = None,
    builder_cls: type = ContextBuilder,
) -> Any:
    """Skill-aware: ``Static(persona) → [Static(react_protocol)] → [ToolsDesc] → [Bootstrap]
    → SkillSet → StateHistory``. ``file_read_tools``, ``resource_root`` and ``resource_paths``
    go to ``SkillSetPromptProvider``.

    >>> from jianmu_fast.skills import Skill
    >>> b = for_skill(skill_set=[Skill("greet", "Say hello.")], include_react=False)
    >>> [type(p).__name__ for p in b.providers]
    ['StaticPromptProvider', 'SkillSetPromptProvider', 'StateHistoryProvider']
    """
    rp = _runtime(runtime_prompt)
    if not isinstance(include_react, bool):
        raise TypeError(f"include_react: expected a bool, got {type(include_react).__name__}")
    skills = skill_set if skill_set is not None else SkillsCatalog.resolve_runtime(rp)
    opts: dict[str, Any] = dict(file_read_tools=file_read_tools, resource_root=resource_root, resource_paths=resource_paths)
    summary = rp is not None and rp.include_skills_summary
    active = rp is not None and rp.include_active_skills
    skill_providers: list[Any] = []
    if summary or not active:
        skill_providers.append(SkillSetPromptProvider(skills, mode=mode, **opts))
    if active:
        skill_providers.append(SkillSetPromptProvider(skills, mode=mode, always_only=True, **opts))
    providers = [
        _persona(system_prompt),
        *([StaticPromptProvider(react_protocol_prompt())] if include_react else []),
        *_tools(tools_desc),
        *_bootstrap(rp),
        *skill_providers,
        _history(),
    ]
    return builder_cls(providers=providers, filters=_filters(max_messages, max_tokens, token_counter))


def resolve_for_llm(
    context_builder: Any = None,
    *,
    runtime_prompt: Optional[PromptRuntimeContext] = None,
    system_prompt: Optional[str] = None,
    tools_desc: Optional[str] = None,
    skill_set: Any = None,
    allow_skill_context: bool = False,
    prefer_react: bool = False,
    **preset_kwargs: Any,
) -> Any:
    """The builder an LLM node should use, first match wins:

    1. ``context_builder`` (returned as is);
    2. ``runtime_prompt.context_builder``;
    3. ``for_skill(...)`` when ``allow_skill_context`` and there is a ``skill_set`` or the
       runtime asks for skills (``skills_catalog``, ``skills_dir``, ``include_skills_summary``
       or ``include_active_skills`` set);
    4. ``for_react(...)`` when ``prefer_react`` or ``tools_desc`` is non-blank;
    5. ``for_chat(...)``.

    ``preset_kwargs`` (``max_messages``, ``max_tokens``, ``token_counter``, and on the skill
    path ``mode``, ``include_react``, ``file_read_tools``, ...) go to the chosen preset;
    the skill-only ones are dropped when another preset is chosen.

    >>> type(resolve_for_llm(prefer_react=True).providers[1]).__name__
    'StaticPromptProvider'
    >>> len(resolve_for_llm().providers)     # chat: persona, history
    2
    """
    if context_builder is not None:
        if not callable(getattr(context_builder, "build", None)):
            raise TypeError(
                "context_builder: expected a ContextBuilderProtocol (build(local_state, ...)), "
                f"got {type(context_builder).__name__}"
            )
        return context_builder
    rp = _runtime(runtime_prompt)
    if rp is not None and rp.context_builder is not None:
        return rp.context_builder
    common: dict[str, Any] = dict(system_prompt=system_prompt, runtime_prompt=rp)
    if allow_skill_context and (skill_set is not None or (rp is not None and rp.requests_skills())):
        return for_skill(skill_set=skill_set, tools_desc=tools_desc, **common, **preset_kwargs)
    kwargs = {k: v for k, v in preset_kwargs.items() if k not in _SKILL_ONLY}
    if prefer_react or (isinstance(tools_desc, str) and tools_desc.strip()):
        return for_react(tools_desc=tools_desc, **common, **kwargs)
    if tools_desc is not None and not isinstance(tools_desc, str):
        raise TypeError(f"tools_desc: expected a str or None, got {type(tools_desc).__name__}")
    return for_chat(**common, **kwargs)
