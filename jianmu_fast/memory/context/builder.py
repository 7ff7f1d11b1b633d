"""``ContextBuilder``: run providers in order, concatenate, run filters in order.

An unexpected exception inside one provider or filter is logged (logger
``jianmu_fast.context``, with the stage's position and name) and that stage is skipped; the
pipeline goes on, as the design document says. Errors of jianmu_fast's own hierarchy
(``ContextBudgetError``, ``ToolCallHistoryError``, ``ConfigError``, ``TokenizerLoadError``,
...) protect the contract's invariants and always propagate.

Hot loop: when every provider before the last is a fixed one (``StaticPromptProvider``,
``ToolsDescProvider``), the last is a ``StateHistoryProvider`` and every filter is one of the
library's own (exact classes, no subclass): ``MaxMessagesFilter``, ``TokenBudgetFilter`` or a
context-editing stage (``ToolResultCapFilter``, ``ClearToolResultsFilter``,
``SummarizingBudgetFilter``; the presets' shapes), ``build()`` keeps its prompt (before the
filters) between calls and, when the history only grew, extends it by the new messages
instead of copying the whole history again; the stages' outputs (lists of Messages) go to
the next stage without the per-message type check, and a trimming filter last decides the
sanitize step in compiled code, as on the general path. The cap and the clearing are handed
the list as it is through ``_hot_apply`` (the kept prompt, or the previous stage's own
output: lists that only grow by appends while they are the same object) and hand on their
own output list under the same rule, so a turn costs them only its new messages (no
comparison with the previous history, no copy of their output). The kept prompt is made anew
whenever a fixed message, the semantics note or the history provider's list is another object
(any edit of the history other than appending, see ``StateHistoryProvider``), when
``providers`` or ``filters`` changed, or when a stage's method was replaced on the instance
(then the general path runs). Neither the kept list nor a stage's own list leaves the builder
(a trimming filter last returns a new list; otherwise the result is copied), the kept list is
not pickled, and a call that finds another thread using it takes the general path. Outputs
and errors are the general path's.
"""

from __future__ import annotations

import inspect
import logging
import threading
from operator import countOf
from typing import Any, Callable, Iterable, Optional, Sequence

from ...errors import JianmuError
from ...message import Message, coerce_messages
from .base import ContextFilter, MessageProvider

__all__ = ["ContextBuilder"]

logger = logging.getLogger("jianmu_fast.context")


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes a keyword argument ``name`` (by name or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD or (p.name == name and p.kind is not p.POSITIONAL_ONLY) for p in params)


#: providers of ours whose ``get_messages`` always returns a new list of Messages
_MESSAGE_LIST_PROVIDERS = frozenset({
    "jianmu_fast.memory.context.providers.static_prompt.StaticPromptProvider",
    "jianmu_fast.memory.context.providers.tools_desc.ToolsDescProvider",
    "jianmu_fast.memory.context.providers.state_history.StateHistoryProvider",
})


def _returns_messages(provider: Any) -> bool:
    """Whether ``provider``'s output needs no coercion (exact type only, not subclasses)."""
    cls = type(provider)
    return f"{cls.__module__}.{cls.__qualname__}" in _MESSAGE_LIST_PROVIDERS


_LAZY: dict[str, Any] = {}


def _window_filter_cls() -> Any:
    """``filters._WindowFilter``, imported on first use (a dict hit afterwards)."""
    cls = _LAZY.get("window")
    if cls is None:
        from .filters import _WindowFilter

        cls = _LAZY["window"] = _WindowFilter
    return cls


def _history_provider_cls() -> Any:
    """``StateHistoryProvider``, imported on first use (a dict hit afterwards)."""
    cls = _LAZY.get("history")
    if cls is None:
        from .providers.state_history import StateHistoryProvider

        cls = _LAZY["history"] = StateHistoryProvider
    return cls


def _static_prompt_cls() -> Any:
    """``StaticPromptProvider``, imported on first use (a dict hit afterwards)."""
    cls = _LAZY.get("static")
    if cls is None:
        from .providers.static_prompt import StaticPromptProvider

        cls = _LAZY["static"] = StaticPromptProvider
    return cls


def _is_trimming(flt: Any) -> bool:
    """Whether ``flt`` is one of the library's trimming filters (their failure is never skipped)."""
    return isinstance(flt, _window_filter_cls())


def _plain_trimming(flt: Any) -> bool:
    """A built-in trimming filter whose ``apply`` is the library's own (not overridden by a
    subclass or on the instance): the builder may call its routine directly."""
    wf = _window_filter_cls()
    return isinstance(flt, wf) and type(flt).apply is wf.apply and "apply" not in vars(flt)


def _check_stages(items: Optional[Iterable[Any]], kind: str, proto: type, method: str, sig: str) -> list[Any]:
    if items is None:
        return []
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(f"{kind}: expected a list of {proto.__name__}, got {type(items).__name__}")
    out = list(items)
    for i, item in enumerate(out):
        if not callable(getattr(item, method, None)):
            raise TypeError(f"{kind}[{i}]: expected a {proto.__name__} ({method}({sig})), got {type(item).__name__}")
    return out


def _limit_filters(max_messages: Optional[int], max_tokens: Optional[int], token_counter: Any) -> list[Any]:
    """The filters of the constructor's limits, in the document's order: messages, then tokens."""
    from .filters import MaxMessagesFilter, TokenBudgetFilter

    if token_counter is not None and max_tokens is None:
        raise ValueError("token_counter= counts tokens for max_tokens=; pass max_tokens= too")
    out: list[Any] = []
    if max_messages is not None:
        out.append(MaxMessagesFilter(max_messages))
    if max_tokens is not None:
        out.append(TokenBudgetFilter(max_tokens, counter=token_counter))
    return out


_EDITING_MODULE = __name__.rpartition(".")[0] + ".editing"


def _editing_classes() -> tuple[type, type, type]:
    """``(ToolResultCapFilter, ClearToolResultsFilter, SummarizingBudgetFilter)``, imported on
    first use (a dict hit afterwards)."""
    classes = _LAZY.get("editing")
    if classes is None:
        from .editing import ClearToolResultsFilter, SummarizingBudgetFilter, ToolResultCapFilter

        classes = _LAZY["editing"] = (ToolResultCapFilter, ClearToolResultsFilter, SummarizingBudgetFilter)
    return classes


def _hot_filter_kind(flt: Any) -> int:
    """0: not a hot-path filter; 1: a context-editing stage (the cap and the clearing) called
    through ``_hot_apply(messages, tools_schema)``: given a list that is only ever grown by
    appends while it is the same object, it returns a list of Messages under the same rule (its
    own, not a copy: the builder only reads it and copies it before handing it out), and never
    changes the list it is given; 2: a trimming filter with ``_trim(messages, tools_schema, sanitize) -> (output, clean)``
    (``MaxMessagesFilter``, ``TokenBudgetFilter``, ``SummarizingBudgetFilter``), which returns
    a new list of Messages too. Exact classes only: a subclass may do anything."""
    from .filters import MaxMessagesFilter, TokenBudgetFilter

    cls = type(flt)
    if cls is MaxMessagesFilter or cls is TokenBudgetFilter:
        return 2
    if not cls.__module__.startswith(_EDITING_MODULE):
        return 0  # (no import of the editing module for a filter that cannot be one of its)
    cap, clear, summarizing = _editing_classes()
    if cls is cap or cls is clear:
        return 1
    return 2 if cls is summarizing else 0


def _hot_call(flt: Any) -> Any:
    """What the builder calls for a kind 1 stage: ``flt._hot_turn.call`` when it has a
    ``_hot_turn`` (an object whose call is ``flt._hot_apply``'s, the same for the stage's life),
    else the bound ``flt._hot_apply``."""
    turn = vars(flt).get("_hot_turn")
    return turn.call if turn is not None and getattr(turn, "flt", None) is flt else flt._hot_apply


def _hint_to(flt: Any, nxt: Any) -> Optional[tuple[Any, Any]]:
    """``(flt._hot_turn, nxt)`` when ``flt``'s compiled turn reports a step's changed positions
    (``ClearingTurn.changed``) and the next filter is a ``TokenBudgetFilter`` or
    ``MaxMessagesFilter`` (exact classes), whose records (``Records.hint``) then patch those
    positions instead of comparing every message; else None. (The hint is checked by the
    records: the same list, the same objects elsewhere, the replaced ones their originals.)"""
    from .filters import MaxMessagesFilter, TokenBudgetFilter

    turn = vars(flt).get("_hot_turn")
    if turn is None or getattr(turn, "flt", None) is not flt or not hasattr(turn, "changed"):
        return None
    return (turn, nxt) if type(nxt) is TokenBudgetFilter or type(nxt) is MaxMessagesFilter else None


def _derive_hot(providers: list[Any], filters: list[Any]) -> Optional["_Hot"]:
    """The hot plan of these stages, or None (see ``_Hot``)."""
    history_cls = _history_provider_cls()
    if not providers or not filters or type(providers[-1]) is not history_cls:
        return None
    kinds = [_hot_filter_kind(f) for f in filters]
    if not all(kinds):
        return None  # the library's own (no subclass): they never keep the list they are given
    heads = providers[:-1]
    if not all(_returns_messages(p) and type(p) is not history_cls for p in heads):
        return None
    return _Hot(providers, filters, kinds)


class _Hot:
    """How ``build()`` may keep its prompt between calls (the agent loop), derived from the
    stages: every provider before the last is one of the library's fixed ones
    (``StaticPromptProvider``, ``ToolsDescProvider``), the last is a ``StateHistoryProvider``,
    and every filter is one of the library's trimming or context-editing filters (which never
    change the list they are given and return a list of Messages: a new one, or for the cap and
    the clearing their own, grown only by appends while it is the same object; see
    ``_hot_filter_kind``)."""

    __slots__ = ("heads", "static", "history", "n", "last", "dicts", "kinds", "steps", "pair")

    def __init__(self, providers: list[Any], filters: list[Any], kinds: list[int]) -> None:
        trims_last = kinds[-1] == 2
        self.heads = providers[:-1]
        static_cls = _static_prompt_cls()
        #: all heads are StaticPromptProviders: their messages are read directly
        self.static = all(type(p) is static_cls for p in self.heads)
        self.history = providers[-1]
        self.n = len(filters)
        #: the last filter when it is a trimming one (called through its ``_trim``), else None
        self.last = filters[-1] if trims_last else None
        #: the stages' instance dicts, where a replaced get_messages / apply / _trim would show
        self.dicts = [(vars(p), "get_messages") for p in providers] + [(vars(f), "apply") for f in filters]
        self.dicts += [(vars(f), "_hot_apply") for f, k in zip(filters, kinds) if k == 1]
        #: each filter's kind (``_hot_filter_kind``): 1 is called through its ``_hot_apply``
        self.kinds = kinds
        if trims_last:
            self.dicts.append((vars(filters[-1]), "_trim"))
        #: ``(index, filter, kind, call, hint)`` of every filter, in order (what ``_filter_hot``
        #: walks); ``call`` is what a kind 1 stage is called through: its ``_hot_turn`` (the
        #: clearing's compiled turn, which is its ``_hot_apply`` with no Python frame on the
        #: agent loop's turn) or its ``_hot_apply``; ``hint`` (see ``_hint_to``) is None or
        #: ``(turn, next filter)``: after the call, the turn's ``changed`` goes to the next
        #: filter's records (``Records.hint``)
        self.steps: tuple[tuple[int, Any, int, Any, Any], ...] = tuple(
            (i, f, k, _hot_call(f) if k == 1 else None, _hint_to(f, filters[i + 1] if i + 1 < len(filters) else None))
            for i, (f, k) in enumerate(zip(filters, kinds)))
        #: ``(call, turn, last, share)`` when the filters are exactly a compiled turn that hints
        #: the trimming filter after it, last (the clearing before the budget: ``_filter_hot``'s
        #: loop unrolled, the same calls in the same order), else None; ``share``: the last is
        #: a ``TokenBudgetFilter``, which reads the turn's counts (``ClearingTurn.counted``, taken
        #: when its counter is the budget's; see ``TokenBudgetFilter._trim_known``)
        self.pair: Optional[tuple[Any, Any, Any, bool]] = None
        if self.n == 2 and self.last is not None and kinds[0] == 1:
            hint = self.steps[0][4]
            if hint is not None and hint[1] is self.last:
                from .filters import TokenBudgetFilter

                self.pair = (self.steps[0][3], hint[0], self.last, type(self.last) is TokenBudgetFilter)


class _Turn:
    """The prompt (before the filters) of the last hot ``build()``: the fixed providers'
    messages, the history provider's note and its history list, how much of that list the
    prompt holds, and the prompt itself (the builder's own list, grown in place while the
    history provider's list grows; the filters only read it)."""

    __slots__ = ("head", "note", "history", "n", "prompt")

    def __init__(self, head: list[Message], note: Optional[Message], history: list[Message], prompt: list[Message]) -> None:
        self.head = head
        self.note = note
        self.history = history
        self.n = len(history)
        self.prompt = prompt


class ContextBuilder:
    """The Provider → Filter pipeline.

    ``max_messages=N`` / ``max_tokens=T`` (with ``token_counter=``) append
    ``MaxMessagesFilter(N)`` then ``TokenBudgetFilter(T, counter=token_counter)`` after the
    given ``filters``, as the design document's ``ContextBuilder(max_messages=N)`` does.

    ``sanitize=True`` (the default) applies ``sanitize_tool_call_history`` as the last step of
    ``build()`` and ``transform()``, so what is sent never holds a broken tool-call
    transaction; a broken newest transaction raises ``ToolCallHistoryError``.

    >>> from jianmu_fast.memory.context import ContextBuilder, StaticPromptProvider, MaxMessagesFilter
    >>> from jianmu_fast.message import human
    >>> b = ContextBuilder(providers=[StaticPromptProvider("You are terse.")],
    ...                    filters=[MaxMessagesFilter(max_messages=1)])
    >>> [m.content for m in b.transform([human("a"), human("b")])]
    ['b']
    >>> [m.content for m in b.build({})]
    ['You are terse.']
    >>> [type(f).__name__ for f in ContextBuilder(max_messages=20, max_tokens=4000).filters]
    ['MaxMessagesFilter', 'TokenBudgetFilter']
    """

    def __init__(
        self,
        providers: Optional[Sequence[Any]] = None,
        filters: Optional[Sequence[Any]] = None,
        *,
        sanitize: bool = True,
        max_messages: Optional[int] = None,
        max_tokens: Optional[int] = None,
        token_counter: Any = None,
    ) -> None:
        self.providers: list[Any] = _check_stages(
            providers, "providers", MessageProvider, "get_messages", "local_state, global_state=None, ctx=None"
        )
        self.filters: list[Any] = _check_stages(
            filters, "filters", ContextFilter, "apply", "messages, local_state=None, global_state=None, ctx=None, **kwargs"
        )
        self.filters.extend(_limit_filters(max_messages, max_tokens, token_counter))
        self.sanitize = bool(sanitize)
        self._derive_stage_flags()
        self._fresh_hot()
        self._hot_stages = (list(self.providers), list(self.filters))
        self._hot = _derive_hot(self.providers, self.filters)

    def _derive_stage_flags(self) -> None:
        self._provider_takes_tools = [_accepts(p.get_messages, "tools_schema") for p in self.providers]
        self._provider_trusted = [_returns_messages(p) for p in self.providers]
        self._filter_takes_tools = [_accepts(f.apply, "tools_schema") for f in self.filters]
        self._filter_builtin = [_is_trimming(f) for f in self.filters]

    def _fresh_hot(self) -> None:
        self._hot: Optional[_Hot] = None
        self._hot_stages: Optional[tuple[list[Any], list[Any]]] = None
        self._turn: Optional[_Turn] = None
        self._turn_lock = threading.Lock()

    _HOT_ATTRS = ("_hot", "_hot_stages", "_turn", "_turn_lock")
    # for subclasses whose __init__ skips ours: derived on the first build()
    _hot: Optional[_Hot] = None
    _hot_stages: Optional[tuple[list[Any], list[Any]]] = None
    _turn: Optional[_Turn] = None
    _turn_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the hot loop's prompt and lock (recreated empty on unpickling)."""
        return {k: v for k, v in self.__dict__.items() if k not in self._HOT_ATTRS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fresh_hot()

    def __repr__(self) -> str:
        return f"ContextBuilder(providers={self.providers!r}, filters={self.filters!r})"

    # -- presets (jianmu_fast.memory.context.presets) ------------------------------------

    @classmethod
    def for_chat(cls, system_prompt=None, max_messages=None, max_tokens=None, runtime_prompt=None,
                 token_counter=None) -> "ContextBuilder":
        """Chat preset: ``Static(persona) → [Bootstrap] → StateHistory``; see ``presets.for_chat``.

        >>> [type(p).__name__ for p in ContextBuilder.for_chat().providers]
        ['StaticPromptProvider', 'StateHistoryProvider']
        """
        from .presets import for_chat

        return for_chat(system_prompt, max_messages, max_tokens, runtime_prompt, token_counter, builder_cls=cls)

    @classmethod
    def for_react(cls, system_prompt=None, max_messages=None, max_tokens=None, runtime_prompt=None,
                  token_counter=None, tools_desc=None, *, tool_result_max_tokens=None, clear_tool_results=None,
                  summarize=None) -> "ContextBuilder":
        """ReAct preset: ``Static(persona) → Static(react_protocol) → [ToolsDesc] → [Bootstrap]
        → StateHistory``; context editing with ``tool_result_max_tokens``, ``clear_tool_results``
        and ``summarize``; see ``presets.for_react``.

        >>> len(ContextBuilder.for_react(tools_desc="- calc").providers)
        4
        """
        from .presets import for_react

        return for_react(system_prompt, max_messages, max_tokens, runtime_prompt, token_counter, tools_desc,
                         tool_result_max_tokens=tool_result_max_tokens, clear_tool_results=clear_tool_results,
                         summarize=summarize, builder_cls=cls)

    @classmethod
    def for_skill(cls, system_prompt=None, max_messages=None, max_tokens=None, runtime_prompt=None,
                  token_counter=None, skill_set=None, mode="summary", include_react=True, tools_desc=None,
                  **skill_options: Any) -> "ContextBuilder":
        """Skill preset: ``Static(persona) → [Static(react_protocol)] → [ToolsDesc] → [Bootstrap]
        → SkillSet → StateHistory``; see ``presets.for_skill``.

        >>> from jianmu_fast.skills import Skill
        >>> type(ContextBuilder.for_skill(skill_set=[Skill("a", "A.")]).providers[2]).__name__
        'SkillSetPromptProvider'
        """
        from .presets import for_skill

        return for_skill(system_prompt, max_messages, max_tokens, runtime_prompt, token_counter, skill_set, mode,
                         include_react, tools_desc, builder_cls=cls, **skill_options)

    def build_report(self, local_state: Any, global_state: Any = None, ctx: Any = None,
                     tools_schema: Optional[Sequence[dict[str, Any]]] = None, counter: Any = None,
                     *, strict: bool = True) -> Any:
        """``build()`` plus the tokens each provider added and each filter dropped: a
        ``BuildReport`` whose ``.messages`` equal ``build()``'s; see ``report.build_report``.

        >>> from jianmu_fast.memory.context import StaticPromptProvider
        >>> ContextBuilder(providers=[StaticPromptProvider("Hi.")]).build_report({}).providers[0].tokens
        5
        """
        from .report import build_report

        return build_report(self, local_state, global_state, ctx, tools_schema, counter, strict=strict)

    # -- the pipeline ---------------------------------------------------------------------

    def build(
        self,
        local_state: Any,
        global_state: Any = None,
        ctx: Any = None,
        tools_schema: Optional[Sequence[dict[str, Any]]] = None,
    ) -> list[Message]:
        """Run every provider in order, concatenate their messages, then run the filters.

        ``local_state`` is the agent's state, ``{"messages": [...]}`` (Messages or plain
        chat-completions dicts), or the history itself as a bare list. With a
        ``StateHistoryProvider``, a non-empty dict without ``"messages"`` is an error
        (``MessageValidationError``), never a prompt that silently lacks the conversation.

        >>> from jianmu_fast.memory.context import ContextBuilder
        >>> from jianmu_fast.message import human
        >>> b = ContextBuilder.for_chat(system_prompt="Be terse.")
        >>> [m.role for m in b.build([human("hi")])] == [m.role for m in b.build({"messages": [human("hi")]})]
        True
        >>> b.build({"msgs": [human("hi")]})
        Traceback (most recent call last):
        ...
        jianmu_fast.errors.MessageValidationError: local_state: expected the history under 'messages' ...
        """
        hot = self._hot_plan()
        if hot is not None and self._turn_lock.acquire(False):
            try:  # the builder's own prompt, grown by the new history (see _provide_hot)
                prompt = self._provide_hot(hot, local_state, global_state, ctx, tools_schema)
                return self._filter_hot(hot, prompt, local_state, global_state, ctx, tools_schema)
            finally:
                self._turn_lock.release()
        messages = self._provide(local_state, global_state, ctx, tools_schema)
        return self._filter(messages, local_state, global_state, ctx, tools_schema)

    def transform(
        self,
        messages: Sequence[Any],
        local_state: Any = None,
        global_state: Any = None,
        ctx: Any = None,
        tools_schema: Optional[Sequence[dict[str, Any]]] = None,
    ) -> list[Message]:
        """Run only the filters over ``messages`` (Messages or chat-completions dicts)."""
        self._hot_plan()  # stage flags derived again if providers/filters changed since
        return self._filter(coerce_messages(messages), local_state, global_state, ctx, tools_schema)

    # -- stages -----------------------------------------------------------------------------

    def _provide(self, local_state, global_state, ctx, tools_schema) -> list[Message]:
        messages: list[Message] = []
        history_cls = _history_provider_cls()
        for i, provider in enumerate(self.providers):
            try:
                if type(provider) is history_cls and "get_messages" not in vars(provider):
                    # the history without get_messages' final copy: extended into ours at once
                    note, history = provider._blocks(local_state, global_state, ctx)
                    if note is not None:
                        messages.append(note)
                    messages.extend(history)
                    continue
                if self._provider_takes_tools[i]:
                    block = provider.get_messages(local_state, global_state, ctx, tools_schema=tools_schema)
                else:
                    block = provider.get_messages(local_state, global_state, ctx)
                if self._provider_trusted[i] or (type(block) is list and countOf(map(type, block), Message) == len(block)):
                    messages.extend(block)  # already Messages: skip the per-item coercion loop
                else:
                    messages.extend(coerce_messages(block, f"providers[{i}] ({type(provider).__name__}) output"))
            except JianmuError:
                raise
            except Exception:
                logger.exception("providers[%d] (%s) failed; its messages are skipped", i, type(provider).__name__)
        return messages

    def _hot_plan(self) -> Optional[_Hot]:
        """The hot path's plan, or None when the stages do not allow it; derived again when
        ``providers`` or ``filters`` changed (a C-level comparison of two short lists), and
        checked for methods replaced on an instance."""
        stages = self._hot_stages
        if stages is None or stages[0] != self.providers or stages[1] != self.filters:
            self._derive_stage_flags()  # the lists were changed after __init__ (or unpickled)
            self._turn = None
            self._hot = _derive_hot(self.providers, self.filters)
            self._hot_stages = (list(self.providers), list(self.filters))
        hot = self._hot
        if hot is not None:
            for d, name in hot.dicts:  # a method replaced on an instance since
                if name in d:
                    return None
        return hot

    def _provide_hot(self, hot: _Hot, local_state: Any, global_state: Any, ctx: Any, tools_schema: Any) -> list[Message]:
        """``_provide`` for the hot plan's stages, into the builder's own list: when the fixed
        messages and the note are the same as last time and the history is the provider's
        same list (which only grows: see ``StateHistoryProvider._blocks``), last call's prompt
        is extended by the new history instead of copied whole."""
        if hot.static:
            head = []
            for p in hot.heads:
                if p.text:
                    head.append(p._message)
        else:
            head = []
            for i, provider in enumerate(hot.heads):
                block = self._provider_block(i, provider, local_state, global_state, ctx, tools_schema)
                if block:
                    head.extend(block)
        try:
            note, history = hot.history._blocks(local_state, global_state, ctx)
        except JianmuError:
            raise
        except Exception:
            logger.exception("providers[%d] (%s) failed; its messages are skipped", len(hot.heads),
                             type(hot.history).__name__)
            self._turn = None
            return head
        turn = self._turn
        if turn is not None and turn.history is history and turn.note is note and turn.head == head:
            k, n = turn.n, len(history)
            if k == n:
                return turn.prompt
            if k < n:
                turn.prompt.extend(history[k:])
                turn.n = n
                return turn.prompt
        prompt = head.copy()
        if note is not None:
            prompt.append(note)
        prompt.extend(history)
        self._turn = _Turn(head, note, history, prompt)
        return prompt

    def _provider_block(self, i: int, provider: Any, local_state: Any, global_state: Any, ctx: Any,
                        tools_schema: Any) -> Optional[list[Message]]:
        """``providers[i]``'s messages, or None (logged) when it fails with a non-library error."""
        try:
            if self._provider_takes_tools[i]:
                block = provider.get_messages(local_state, global_state, ctx, tools_schema=tools_schema)
            else:
                block = provider.get_messages(local_state, global_state, ctx)
            if self._provider_trusted[i] or (type(block) is list and countOf(map(type, block), Message) == len(block)):
                return block  # already Messages: skip the per-item coercion loop
            return coerce_messages(block, f"providers[{i}] ({type(provider).__name__}) output")
        except JianmuError:
            raise
        except Exception:
            logger.exception("providers[%d] (%s) failed; its messages are skipped", i, type(provider).__name__)
            return None

    def _filter(self, messages, local_state, global_state, ctx, tools_schema) -> list[Message]:
        last = len(self.filters) - 1
        for i in range(last):
            messages = self._apply_filter(i, messages, local_state, global_state, ctx, tools_schema)
        if last >= 0 and self.sanitize and _plain_trimming(self.filters[last]):
            # a built-in trimming filter last: it also decides, in compiled code, whether its
            # output needs the sanitizing step (almost never); see _WindowFilter._trim
            out, clean = self.filters[last]._trim(messages, tools_schema, True)
            return out if clean else self._finish(out, tools_schema)
        if last >= 0:
            messages = self._apply_filter(last, messages, local_state, global_state, ctx, tools_schema)
        return self._finish(messages, tools_schema)

    def _filter_hot(self, hot: _Hot, prompt: list[Message], local_state: Any, global_state: Any, ctx: Any,
                    tools_schema: Any) -> list[Message]:
        """``_filter`` for the hot plan's filters over the builder's own ``prompt``: the same
        outputs, error isolation and sanitize step, without the per-message type check of each
        stage's output (a list of Messages from a stage given Messages, see
        ``_hot_filter_kind``). A context-editing stage (kind 1) is handed the list as it is
        (the prompt, which only grows by appends while it is the same object, or the previous
        stage's own list, under the same rule) and hands on its own list: one that is not a
        new one is copied before it leaves the builder."""
        pair = hot.pair
        if pair is not None and self.sanitize:  # the loop below for [compiled turn, trimming filter]
            call, turn, last, share = pair
            messages = prompt
            try:
                messages = call(prompt, tools_schema)
                changed = turn.changed
                if changed is not None:  # a step: the next stage's records patch its positions
                    rec = last._rec
                    if rec is not None:
                        rec.hint(*changed)
            except JianmuError:
                raise
            except Exception:
                logger.exception("filters[%d] (%s) failed; it is skipped", 0, type(hot.steps[0][1]).__name__)
            # the clearing's records (its counts of the turn's new messages) for the budget's
            out, clean = last._trim_known(messages, tools_schema, turn.counted) if share else last._trim(
                messages, tools_schema, True)
            return out if clean else self._finish(out, tools_schema)
        messages = prompt
        own = True  # ``messages`` is the builder's prompt or a stage's own list: never handed out
        last = hot.last
        trim_last = last is not None and self.sanitize
        for i, flt, kind, call, hint in hot.steps:
            if kind == 1:
                try:
                    messages = call(messages, tools_schema)
                    own = True
                    if hint is not None:
                        changed = hint[0].changed
                        if changed is not None:  # a step: the next stage's records patch its positions
                            rec = hint[1]._rec
                            if rec is not None:
                                rec.hint(*changed)
                except JianmuError:
                    raise
                except Exception:
                    logger.exception("filters[%d] (%s) failed; it is skipped", i, type(flt).__name__)
            elif trim_last and flt is last and i == hot.n - 1:  # _filter's path for a trimming filter last
                out, clean = last._trim(messages, tools_schema, True)
                return out if clean else self._finish(out, tools_schema)
            else:
                out = self._apply_filter(i, messages, local_state, global_state, ctx, tools_schema, True)
                if out is not messages:
                    own = False
                messages = out
        if own:  # never hand out our own list, nor a stage's
            messages = messages.copy()
        return self._finish(messages, tools_schema)

    def _apply_filter(self, i, messages, local_state, global_state, ctx, tools_schema,
                      trusted: bool = False) -> list[Message]:
        """Run ``filters[i]`` with the pipeline's error isolation (shared with ``jianmu_fast.batch``).
        ``trusted``: the filter is known to return a new list of Messages (the hot plan's)."""
        flt = self.filters[i]
        try:
            if self._filter_takes_tools[i]:
                out = flt.apply(messages, local_state, global_state, ctx, tools_schema=tools_schema)
            else:
                out = flt.apply(messages, local_state, global_state, ctx)
            if trusted or (type(out) is list and countOf(map(type, out), Message) == len(out)):
                return out  # already a list of Messages: skip the per-item coercion loop
            return coerce_messages(out, f"filters[{i}] ({type(flt).__name__}) output")
        except JianmuError:
            raise
        except Exception as exc:
            if self._filter_builtin[i]:  # never send an untrimmed prompt (built-ins raise JianmuError anyway)
                from ...errors import TrimmingError

                raise TrimmingError(f"filters[{i}] ({type(flt).__name__}) failed: {type(exc).__name__}: {exc}") from exc
            logger.exception("filters[%d] (%s) failed; it is skipped", i, type(flt).__name__)
            return messages

    def _finish(self, messages: list[Message], tools_schema: Any = None) -> list[Message]:
        """The last step of ``build()``/``transform()``: sanitize when ``self.sanitize``.

        Sanitizing may fill ids (a call's from its result, a result's from its single call),
        which some counters count: the filters did not see those tokens. The budget is a
        property of what is returned, so when ids were filled every ``TokenBudgetFilter`` of
        the pipeline checks the final prompt (tools included) and trims it again if it is over.
        """
        if not self.sanitize:
            return messages
        from ...message.sanitize import sanitize_tool_call_history_report

        report = sanitize_tool_call_history_report(messages)
        out = report.messages
        if report.filled or report.filled_results:
            out = self._rebudget(out, tools_schema)
        return out

    def _rebudget(self, out: list[Message], tools_schema: Any) -> list[Message]:
        from ...message.sanitize import sanitize_tool_call_history
        from .filters import TokenBudgetFilter

        for flt in self.filters:
            if isinstance(flt, TokenBudgetFilter):
                if flt.counter.count_messages(out) + flt.tools_cost(tools_schema, out) > flt.max_tokens:
                    out = sanitize_tool_call_history(flt.apply(out, tools_schema=tools_schema))
        return out
