"""The provider stage of ``jianmu_fast.batch``: every state's provided prompt.

With the usual builder (the library's own fixed-text providers around one
``StateHistoryProvider`` without working memory, none of them overridden), states that are
dicts whose histories are prefixes of one conversation (by identity) share one provider call
on the longest of them, and each gets its slice of that output (``group_states`` and
``prefix_prompts`` of the compiled batch core). Every other state runs the providers itself
(``builder._provide``, as ``build()`` does), grouped by conversation, shortest first.
"""

from __future__ import annotations

from operator import countOf
from typing import Any, Optional, Sequence

from . import _backend
from .message import Message

__all__ = ["provide_all", "provider_order"]


def provide_all(builder, states, global_state, ctx, tools_schema, errors, tick) -> list[Any]:
    """Every state's provided prompt (``None`` where it failed: the error is in ``errors``)."""
    n = len(states)
    prompts: list[Any] = [None] * n
    rest = _provide_grouped(builder, states, global_state, ctx, prompts)
    done = 0 if rest is None else n - len(rest)
    if tick is not None and done >= 256:
        tick(done - done % 256)
    provide = builder._provide
    for i in provider_order(states) if rest is None else provider_order([states[i] for i in rest]):
        if rest is not None:
            i = rest[i]
        try:
            prompts[i] = provide(states[i], global_state, ctx, tools_schema)
        except Exception as exc:
            errors[i] = exc
        done += 1
        if tick is not None and not done & 255:
            tick(256)
    return prompts


def _fixed_providers(builder, global_state, ctx) -> Optional[tuple[list[Message], Any, list[Message]]]:
    """``(head, history provider, tail)`` when the builder's providers are the library's own
    fixed-text providers around one ``StateHistoryProvider`` (no working memory), none of
    them overridden: the prompt of a state is then ``head + [note] + history + tail``."""
    from .memory.context.providers.state_history import StateHistoryProvider
    from .memory.context.providers.static_prompt import StaticPromptProvider
    from .memory.context.providers.tools_desc import ToolsDescProvider

    head: list[Message] = []
    tail: list[Message] = []
    history = None
    for p in builder.providers:
        cls = type(p)
        if "get_messages" in vars(p):
            return None
        if cls is StateHistoryProvider and history is None and p.working_memory is None and "_blocks" not in vars(p):
            history = p
        elif cls is StaticPromptProvider or cls is ToolsDescProvider:
            try:
                block = p.get_messages(None, global_state, ctx)
            except Exception:  # its error belongs to each state: the per-state path raises it
                return None
            (tail if history is not None else head).extend(block)
        else:
            return None
    return None if history is None else (head, history, tail)


def _provide_grouped(builder, states, global_state, ctx, prompts) -> Optional[list[int]]:
    """The provider stage of the usual builder (``_fixed_providers``) for states that are
    dicts holding a list of Messages: states whose histories are prefixes of one longest
    history (by identity) share one provider call on it, and each gets a slice of its
    output (the history provider annotates each message from it and the messages before
    it only; the semantics note goes with any annotated message). Fills ``prompts`` and
    returns the indices left to the per-state path, or ``None`` when not applicable."""
    fixed = _fixed_providers(builder, global_state, ctx)
    if fixed is None:
        return None
    head, hp, tail = fixed
    srcs, order, group_off, tops, rest = _backend.group_states(states, hp.messages_key)
    prefix_prompts = _backend.prefix_prompts
    bounds = group_off.tolist()
    for g, top in enumerate(tops.tolist()):
        members = order[bounds[g]:bounds[g + 1]]
        longest = srcs[top]
        if countOf(map(type, longest), Message) != len(longest):
            rest.extend(members.tolist())
            continue
        try:
            note, hist = hp._blocks(states[top], global_state, ctx)
        except Exception:  # the per-state path raises or logs it for each state
            rest.extend(members.tolist())
            continue
        if type(hist) is not list or len(hist) != len(longest):
            rest.extend(members.tolist())
            continue
        # the states whose histories are not prefixes of the longest (by identity) go on
        rest.extend(prefix_prompts(head, head + [note] if note is not None else head, tail, hist, longest,
                                   srcs, members, prompts))
    rest.sort()
    return rest


def provider_order(states: list[Any]) -> Sequence[int]:
    """The order to run providers in: states whose ``"messages"`` lists start with the same
    message are grouped, shortest first, so that an incremental provider (the history
    provider reuses its previous output when the new history extends it) does work for the
    new messages only. Any other state keeps its place; results keep the input order.

    >>> from jianmu_fast.message import human
    >>> a, b = human("a"), human("b")
    >>> order = provider_order([{"messages": [a, b]}, None, {"messages": [a]}])
    >>> order.index(2) < order.index(0)
    True
    """
    keys = []
    for i, s in enumerate(states):
        ms = s.get("messages") if isinstance(s, dict) else None
        keys.append((id(ms[0]), len(ms), i) if type(ms) is list and ms else (-1, 0, i))
    keys.sort()
    return [k[2] for k in keys]
