"""The command as a library: the ``build`` arguments of a spec dict, and what ``jianmu-fast build
--on-error skip`` makes of a list of conversations (``integrations.ray`` uses both)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Optional, Sequence

from .commands import make_parser
from .common import UsageError, reason_of
from .options import MAX_LIMIT
from .processing import Job, Line, process

__all__ = ["spec_namespace", "ConversationResult", "process_conversations"]


def spec_namespace(spec: dict[str, Any]) -> argparse.Namespace:
    """The ``build`` arguments of a spec dict (the command line's names, with underscores):
    the defaults of ``jianmu-fast build``, overridden by ``spec``, checked as the flags are.
    ``tools_desc`` (text) may stand for ``tools_desc_file``, ``tools`` (a list) for
    ``tools_file``.

    >>> ns = spec_namespace({"preset": "react", "max_tokens": 800})
    >>> ns.preset, ns.max_tokens, ns.tokenizer, ns.on_error
    ('react', 800, 'o200k_base', 'skip')
    >>> spec_namespace({"max_tokens": 0})
    Traceback (most recent call last):
    ...
    jianmu_fast.cli.UsageError: spec['max_tokens']: expected an int from 1 to 1,000,000,000, got 0
    """
    args = make_parser().parse_args(["build", "-", "--on-error", "skip"])
    checks: dict[str, Any] = {
        "preset": ("chat", "react", "skill"), "format": ("openai", "anthropic"),
        "max_tokens": (1, MAX_LIMIT), "max_messages": (1, MAX_LIMIT),
    }
    for key, value in spec.items():
        rule = checks.get(key)
        if isinstance(rule, tuple) and len(rule) == 2 and isinstance(rule[0], int) and value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or not rule[0] <= value <= rule[1]:
                raise UsageError(f"spec[{key!r}]: expected an int from {rule[0]:,} to {rule[1]:,}, got {value!r}")
        elif rule is not None and value not in rule:
            raise UsageError(f"spec[{key!r}]: expected one of {', '.join(rule)}, got {value!r}")
        setattr(args, key, value)
    return args


class ConversationResult:
    """One conversation of :func:`process_conversations`: the prompt (chat-completions dicts, as
    an output line of ``jianmu-fast build`` holds them) or the reason it failed."""

    __slots__ = ("messages", "prompt_tokens", "dropped", "error", "warnings", "extra")

    def __init__(self, line: Line) -> None:
        self.error = line.error
        self.warnings = list(line.warnings)
        self.messages: Optional[list[dict[str, Any]]] = None
        self.prompt_tokens: Optional[int] = None
        self.dropped: Optional[dict[str, Any]] = None
        self.extra: dict[str, Any] = {}
        if line.error is None:
            obj = json.loads(line.output)
            self.messages = obj.pop("messages")
            self.prompt_tokens = obj.pop("prompt_tokens")
            self.dropped = obj.pop("dropped")
            self.extra = obj


def process_conversations(conversations: Sequence[Any], builder: Any, counter: Any,
                          tools_schema: Optional[list[dict[str, Any]]] = None,
                          args: Optional[argparse.Namespace] = None) -> list[ConversationResult]:
    """What ``jianmu-fast build --on-error skip`` makes of each conversation (a list of
    chat-completions messages, or a ``{"messages": [...]}`` object), in order: the same
    persona rule, sanitize warnings, errors with input positions, counts and ``dropped``.

    >>> from jianmu_fast.cli import make_builder
    >>> from jianmu_fast.memory.context import ContextBuilder, SimpleTokenCounter
    >>> c = SimpleTokenCounter()
    >>> b = make_builder(spec_namespace({"system_prompt": "Be brief."}), c)
    >>> [r.messages for r in process_conversations([[{"role": "user", "content": "hi"}]], b, c)]
    [[{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}]]
    """
    if args is None:
        args = spec_namespace({})
    job = Job(args, builder, counter, None, "<conversations>", tools_schema)  # type: ignore[arg-type]
    lines: dict[int, Line] = {}
    chunk = []
    for i, conv in enumerate(conversations):
        obj = conv if isinstance(conv, dict) else {"messages": conv}
        try:  # the conversation as an input line, so that it is read exactly as the command reads one
            chunk.append((i + 1, json.dumps(obj, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")))
        except (TypeError, ValueError) as exc:  # not JSON data (an object, NaN): this row's error
            lines[i + 1] = Line(i + 1, False)
            lines[i + 1].error = f"not a conversation: {reason_of(exc)}"
    for line in process(chunk, job):
        lines[line.lineno] = line
    return [ConversationResult(lines[i + 1]) for i in range(len(conversations))]
