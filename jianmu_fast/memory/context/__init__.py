"""Context building: providers, filters, counters and the builder.

>>> from jianmu_fast.memory.context import ContextBuilder, StaticPromptProvider, TokenBudgetFilter
>>> from jianmu_fast.message import human
>>> b = ContextBuilder(providers=[StaticPromptProvider("Hi.")], filters=[TokenBudgetFilter(100)])
>>> [m.role for m in b.transform([human("hello")])]
['user']
"""

from .base import ContextBuilderProtocol, ContextFilter, MessageProvider, TokenCounterProtocol
from .builder import ContextBuilder
from .counters import HFTokenCounter, SimpleTokenCounter, TiktokenTokenCounter
from .chat_template import ChatTemplateTokenCounter
from .filters import MaxMessagesFilter, TokenBudgetFilter
from .editing import ClearToolResultsFilter, SummarizingBudgetFilter, ToolResultCapFilter, summarizer_from_client
from .providers import StaticPromptProvider, ToolsDescProvider
from .providers import BootstrapFilesProvider, SkillSetPromptProvider
from .providers import StateHistoryProvider
from .presets import resolve_for_llm
from .report import BuildReport
from .runtime import PromptRuntimeContext, RunContext

__all__ = [
    "ContextBuilder",
    "ContextBuilderProtocol",
    "MessageProvider",
    "ContextFilter",
    "TokenCounterProtocol",
    "StaticPromptProvider",
    "ToolsDescProvider",
    "MaxMessagesFilter",
    "TokenBudgetFilter",
    "ToolResultCapFilter",
    "ClearToolResultsFilter",
    "SummarizingBudgetFilter",
    "summarizer_from_client",
    "SimpleTokenCounter",
    "TiktokenTokenCounter",
    "HFTokenCounter",
    "ChatTemplateTokenCounter",
    "BootstrapFilesProvider",
    "SkillSetPromptProvider",
    "StateHistoryProvider",
    "PromptRuntimeContext",
    "RunContext",
    "resolve_for_llm",
    "BuildReport",
]
