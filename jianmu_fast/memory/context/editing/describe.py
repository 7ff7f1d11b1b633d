"""``describe_edits``: the line ``build_report`` shows for what an editing stage did."""

from __future__ import annotations

from typing import Any, Sequence

from ....message import Message
from ._common import EDIT_KEY

__all__ = ["describe_edits"]


def describe_edits(before: Sequence[Message], after: Sequence[Message], counter: Any = None) -> str:
    """What a stage edited, from the ``context_edit`` metadata of the messages it made (those
    of ``after`` that are not objects of ``before``); ``""`` when nothing.

    >>> from jianmu_fast.message import tool
    >>> from jianmu_fast.memory.context.editing import ToolResultCapFilter
    >>> m = tool("x" * 400, tool_call_id="c1")
    >>> describe_edits([m], ToolResultCapFilter(20).apply([m]))
    'cut 1 result(s) (-80 tokens)'
    """
    seen = {id(m) for m in before}
    cut = cut_tokens = cleared = cleared_tokens = inputs = 0
    summaries: list[str] = []
    for m in after:
        if id(m) in seen:
            continue
        edit = m.metadata.get(EDIT_KEY) if m.metadata else None
        if not edit:
            continue
        kind = edit.get("kind")
        if kind == "cut":
            cut += 1
            cut_tokens += int(edit.get("tokens_before", 0)) - int(edit.get("tokens_after", 0))
        elif kind == "cleared":
            cleared += 1
            cleared_tokens += int(edit.get("tokens_saved", 0))
        elif kind == "inputs_cleared":
            inputs += 1
        elif kind == "summary":
            summaries.append(f"summary of {edit.get('messages')} message(s) ({edit.get('units')} unit(s))")
    parts = []
    if cut:
        parts.append(f"cut {cut} result(s) (-{cut_tokens} tokens)")
    if cleared:
        parts.append(f"cleared {cleared} result(s) (-{cleared_tokens} tokens)")
    if inputs:
        parts.append(f"cleared the inputs of {inputs} call message(s)")
    parts.extend(summaries)
    return ", ".join(parts)
