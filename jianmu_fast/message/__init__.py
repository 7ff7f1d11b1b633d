"""Messages: the record, its factories and conversions (and, in ``store``, their storage).

>>> from jianmu_fast.message import system, human, ai, tool
>>> [m.role for m in (system("s"), human("h"), ai("a"), tool("{}", name="calc"))]
['system', 'user', 'assistant', 'tool']
"""

from ..errors import MessageValidationError, ToolCallHistoryError
from .model import Message, Role, ai, coerce_message, coerce_messages, human, system, tool
from .sanitize import (
    DroppedUnit,
    FilledCallId,
    SanitizeReport,
    sanitize_tool_call_history,
    sanitize_tool_call_history_report,
)
from .store import (
    LenientMessageCoercer,
    MaxCountRetention,
    MessageEvent,
    StateMessageStore,
    StrictMessageCoercer,
)

__all__ = [
    "Message",
    "Role",
    "system",
    "human",
    "ai",
    "tool",
    "coerce_message",
    "coerce_messages",
    "MessageValidationError",
    "ToolCallHistoryError",
    "sanitize_tool_call_history",
    "sanitize_tool_call_history_report",
    "SanitizeReport",
    "DroppedUnit",
    "FilledCallId",
    "StateMessageStore",
    "StrictMessageCoercer",
    "LenientMessageCoercer",
    "MaxCountRetention",
    "MessageEvent",
]
