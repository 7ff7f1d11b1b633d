"""The provider stage of ``jianmu_fast.batch``: every state's provided prompt.

With the usual builder (the library's own fixed-text providers around one
``StateHistoryProvider`` without working memory, none of them overridden), states that are
dicts whose histories are prefixes of one conversation (by identity) share one provider call
on the longest of them, and each gets its slice of that output (``group_states`` and
``prefix_groups`` of the compiled batch core). Every other state runs the providers itself
(``builder._provide``, as ``build()`` does), grouped by conversation, shortest first.

The prompts of the grouped states are ``head + [note] + history[:k] + tail``: when the batch's
first stage reads prompts as rows (a trimming filter, ``_batch_plan.trim_many``), they are
handed over as rows only (``pack_rows``: one row lookup per distinct message, not one list
per state); otherwise they are read out of the rows as lists (``gather_rows``).
"""

from __future__ import annotations

from operator import countOf
from typing import Any, Optional, Sequence

import numpy as np

from . import _backend
from .message import Message

__all__ = ["provide_all", "provider_order"]

#: ``pack_rows``' arguments but the prompts: ``(head, tail, notes, hists, firsts, srcs, gid)``
Grouped = tuple[list[Message], list[Message], list[Any], list[Any], np.ndarray, list[Any], np.ndarray]


def provide_all(builder, states, global_state, ctx, tools_schema, errors, tick, pack: bool = False) -> tuple[list[Any], Any]:
    """``(prompts, packed)``: every state's provided prompt (``None`` where it failed: the
    error is in ``errors``). With ``pack`` and when no state failed, ``packed`` is
    ``intern_rows(prompts, Message)``'s result for every state, and the grouped states' slots
    in ``prompts`` are ``None`` (their prompts exist as rows only); otherwise ``packed`` is
    ``None`` and every slot holds a list (or ``None`` for a failed state)."""
    n = len(states)
    prompts: list[Any] = [None] * n
    grouped = _provide_grouped(builder, states, global_state, ctx)
    rest = None if grouped is None else np.flatnonzero(grouped[6] < 0).tolist()
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
    if grouped is None:
        return prompts, None
    gid = grouped[6]
    if pack and not errors:
        packed = _backend.pack_rows(*grouped, prompts, Message)
        _fill_bad(prompts, grouped, packed[3])
        return prompts, packed
    # lists: the grouped states' prompts read out of their rows (the others' rows left empty)
    rows, off, distinct, bad = _backend.pack_rows(*grouped, [[]] * n, Message)
    whole = np.zeros((n, 4), dtype=np.int64)
    whole[:, 3] = np.diff(off)
    outs = _backend.gather_rows(distinct, rows, off, whole)
    for i in np.flatnonzero(gid >= 0).tolist():
        prompts[i] = outs[i]
    _fill_bad(prompts, grouped, bad)
    return prompts, None


def _fill_bad(prompts: list[Any], grouped: Grouped, bad: list[int]) -> None:
    """The prompt lists of grouped states that hold an item not exactly a ``Message`` (which
    ``pack_rows`` gives no rows): ``head + [note] + history[:k] + tail`` (its definition)."""
    head, tail, notes, hists, firsts, srcs, gid = grouped
    for i in bad:
        g = int(gid[i])
        if g >= 0:
            k = len(srcs[i])
            note = [notes[g]] if notes[g] is not None and k > firsts[g] else []
            prompts[i] = head + note + hists[g][:k] + tail


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


def _provide_grouped(builder, states, global_state, ctx) -> Optional[Grouped]:
    """The provider stage of the usual builder (``_fixed_providers``) for states that are
    dicts holding a list of Messages: states whose histories are prefixes of one longest
    history (by identity) share one provider call on it, and each gets a slice of its
    output (the history provider annotates each message from it and the messages before
    it only; the semantics note goes with any annotated message). Returns ``pack_rows``'
    arguments but the prompts, ``(head, tail, notes, hists, firsts, srcs, gid)``, where
    ``gid[i] < 0`` marks a state left to the per-state path; ``None`` when not applicable."""
    fixed = _fixed_providers(builder, global_state, ctx)
    if fixed is None:
        return None
    head, hp, tail = fixed
    srcs, order, group_off, tops, _ = _backend.group_states(states, hp.messages_key)
    notes: list[Any] = []
    hists: list[Any] = []
    top_list = tops.tolist()
    for top in top_list:
        longest = srcs[top]
        note = hist = None
        if countOf(map(type, longest), Message) == len(longest):
            try:
                note, hist = hp._blocks(states[top], global_state, ctx)
            except Exception:  # the per-state path raises or logs it for each state
                note = hist = None
            if type(hist) is not list or len(hist) != len(longest):
                note = hist = None
        notes.append(note)
        hists.append(hist)
    for g, (hist, top) in enumerate(zip(hists, top_list)):
        # the provider's output list only grows, and a later call may have grown an earlier
        # one in place (a longest history that extends an equal copy of another): its head
        n = len(srcs[top])
        if hist is not None and len(hist) != n:
            hists[g] = hist[:n]
    # states whose histories are not prefixes of their group's longest (by identity) go on
    gid, firsts = _backend.prefix_groups(hists, srcs, order, group_off, tops)
    return head, tail, notes, hists, firsts, srcs, gid


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
