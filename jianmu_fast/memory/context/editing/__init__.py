"""Context editing: cap oversized tool results, clear old ones, summarize what the budget drops.

Three filters, usable alone, in any ``ContextBuilder`` and in ``ContextBuilder.for_react``:

- :class:`ToolResultCapFilter` cuts a tool result over ``max_tokens`` to its head and tail
  around a marker saying how many tokens were left out;
- :class:`ClearToolResultsFilter` replaces the content of old tool results by a placeholder
  once the prompt is over a trigger, in steps, monotonically along a growing history;
- :class:`SummarizingBudgetFilter` is a token budget that puts one summary of what it drops
  right after the pinned prefix.

They edit content, never roles or ids, so tool-call pairing stays valid. An edited message is a
new ``Message`` (the caller's object is untouched) with the same ``id`` and a
``metadata["context_edit"]`` entry saying what was done (``{"kind": "cut" | "cleared" |
"inputs_cleared" | "summary", ...}``); :func:`describe_edits` turns those into the line
``build_report`` shows. Edits are computed once per distinct message and cached, so a hot loop
returns the same objects turn after turn (the next stage's caches hit, and a prompt that
extends the previous one still does).


Run them before the budget filter, in this order: cap, clear, budget (``for_react`` does).

One module per concept: ``cap`` (``ToolResultCapFilter``), ``clearing``
(``ClearToolResultsFilter``), ``summarizing`` (``SummarizingBudgetFilter``) with ``summarizer``
(``summarizer_from_client``, ``SummaryFailedWarning``), ``describe`` (``describe_edits``), and
what they share in ``_common`` and ``_cutter``.
"""

from __future__ import annotations

from ._common import DEFAULT_CUT_MARKER
from ._cutter import Cutter as _Cutter  # noqa: F401  (pickles made before the split name ``editing._Cutter``)
from .cap import ToolResultCapFilter
from .clearing import ClearToolResultsFilter
from .describe import describe_edits
from .summarizer import DEFAULT_SUMMARY_PROMPT, SummaryFailedWarning, summarizer_from_client
from .summarizing import SUMMARY_HEADER, SummarizingBudgetFilter

__all__ = [
    "ToolResultCapFilter",
    "ClearToolResultsFilter",
    "SummarizingBudgetFilter",
    "SummaryFailedWarning",
    "summarizer_from_client",
    "describe_edits",
    "DEFAULT_CUT_MARKER",
    "DEFAULT_SUMMARY_PROMPT",
    "SUMMARY_HEADER",
]
