"""``Constraints``: global limits from the ``constraints:`` section of ``jianmu.yaml``.

``max_messages`` is one of three layers that bound history length (the design document's
"约束联动"): ``Constraints.max_messages`` is the global setting, read by guards and by the
presets (``ContextBuilder.for_chat(max_messages=None)`` falls back to it);
``StateMessageStore(max_messages=N)`` bounds what is stored; ``MaxMessagesFilter`` bounds
what one prompt sends. They may differ: store 100 messages, send the newest 20.

>>> Constraints().max_messages is None
True
>>> Constraints(max_messages=20)
Constraints(max_messages=20)
>>> Constraints.from_config(JianmuConfig(constraints={"clear_tool_results": 3})).clear_tool_results
3

``tool_result_max_tokens`` and ``clear_tool_results`` configure the presets' context-editing
stages (``ToolResultCapFilter`` and ``ClearToolResultsFilter(keep=...)``; see
``jianmu_fast.memory.context.editing``) when ``for_react`` is not given them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .loader import JianmuConfig, load_config

__all__ = ["Constraints"]


@dataclass(frozen=True)
class Constraints:
    """Global limits; ``None`` means "no limit configured".

    >>> Constraints.from_config(JianmuConfig()).max_messages is None
    True
    """

    max_messages: Optional[int] = None
    """Upper bound on the non-pinned messages a prompt keeps (a positive int)."""
    tool_result_max_tokens: Optional[int] = field(default=None, repr=False)
    """``ToolResultCapFilter``'s cap in the presets (``constraints.tool_result_max_tokens``)."""
    clear_tool_results: Optional[int] = field(default=None, repr=False)
    """``ClearToolResultsFilter``'s ``keep`` in the presets (``constraints.clear_tool_results``)."""

    def __post_init__(self) -> None:
        m = self.max_messages
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"max_messages must be a positive int or None, got {m!r}")
        for name, lo in (("tool_result_max_tokens", 1), ("clear_tool_results", 0)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
                kind = "a positive int" if lo else "an int >= 0"
                raise ValueError(f"constraints.{name} must be {kind} or None, got {v!r}")

    @classmethod
    def from_config(cls, config: JianmuConfig) -> "Constraints":
        """The constraints of an already loaded configuration.

        >>> Constraints.from_config(JianmuConfig(constraints={"max_messages": 7}))
        Constraints(max_messages=7)
        """
        c = config.constraints
        return cls(max_messages=c.get("max_messages"), tool_result_max_tokens=c.get("tool_result_max_tokens"),
                   clear_tool_results=c.get("clear_tool_results"))

    @classmethod
    def load(cls) -> "Constraints":
        """The constraints of the configuration file in effect (see ``loader``).

        >>> Constraints.load().max_messages is None   # no jianmu.yaml here
        True
        """
        return cls.from_config(load_config())
