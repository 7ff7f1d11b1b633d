"""Processing a chunk of input lines (on this process, its workers or Ray's): parse, sanitize,
build, render, and report errors with the input's message positions."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from typing import Any, Optional, Sequence

from .builder import split_persona
from .common import PROG, reason_of
from .reading import decode_line, parse_line
from .writing import Output

__all__ = ["Line", "Job", "process", "emit"]


class _Stats:
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.dropped_tokens = 0
        self.dropped_messages = 0
        self.failed = 0
        self.t0 = time.perf_counter()


class Line:
    """One input line on its way through: parsed, built, rendered, or failed."""

    __slots__ = ("lineno", "rest", "history", "clean", "persona", "replace_persona", "error", "warnings", "output",
                 "tokens", "dropped_tokens")

    def __init__(self, lineno: int, replace_persona: bool) -> None:
        self.lineno = lineno
        self.rest: dict[str, Any] = {}
        self.history: list[Any] = []  # the input's messages, as given
        self.clean: list[Any] = []  # the same without broken historical tool-call units
        self.persona = 0  # how many leading system messages the input has
        self.replace_persona = replace_persona  # --system-prompt replaces them
        self.error: Optional[str] = None
        self.warnings: list[str] = []
        self.output = b""
        self.tokens = 0
        self.dropped_tokens = 0

    def state(self) -> dict[str, Any]:
        """The builder's state: the input's leading system messages are the persona (or
        replaced by ``--system-prompt``), the rest is the history."""
        persona, history = self.clean[:self.persona], self.clean[self.persona:]
        return {"messages": history} if self.replace_persona else {"messages": history, "persona": persona}


class Job:
    """What every chunk of a ``build`` run shares."""

    def __init__(self, args: argparse.Namespace, builder: Any, counter: Any, dst: Output, src_name: str,
                 tools: Optional[list[dict[str, Any]]] = None) -> None:
        self.args = args
        self.builder = builder
        self.counter = counter
        self.tools = tools
        self.dst = dst
        self.src_name = src_name
        self.stats = _Stats()
        self.collector: Any = None  # a run_stats.RunCollector with --report

    def report(self, lineno: int, text: str) -> None:
        print(f"{PROG}: {self.src_name}:{lineno}: {text}", file=sys.stderr)

def process(chunk: list[tuple[int, bytes]], job: Job) -> list[Line]:
    """Parse, build and render one chunk of lines (nothing is written or reported here: the Ray
    engine runs this on its workers).

    Whatever one line's content makes fail (its bytes, its JSON, its messages, its prompt,
    rendering it) is that line's error; under ``raise``, lines after the first bad one are
    neither built nor reported.
    """
    stop_early = job.args.on_error == "raise"
    lines: list[Line] = []
    replace = job.args.system_prompt is not None or job.args.system_prompt_file is not None
    for lineno, raw in chunk:
        line = Line(lineno, replace)
        lines.append(line)
        try:
            line.rest, line.history = parse_line(decode_line(raw, lineno), getattr(job.args, "format", "openai"))
            line.persona = len(split_persona(line.history)[0])
            _sanitize(line)
        except Exception as exc:  # MessageValidationError is a ValueError too
            line.error = reason_of(exc)
            if stop_early:
                break
    todo = [line for line in lines if line.error is None]
    if job.collector is not None:  # --report: label and count what the providers give
        job.collector.count(todo)
    results = _build_lines(job, [line.state() for line in todo])
    if job.collector is not None:
        job.collector.built(todo, results)
    for line, result in zip(todo, results):
        if isinstance(result, BaseException):
            line.error = _input_indices(reason_of(result), job, line)
            continue
        try:
            _render(job, line, result)
        except Exception as exc:  # e.g. a value that is not strict JSON
            line.error = reason_of(exc)
    return lines


def emit(lines: Sequence[Line], job: Job) -> bool:
    """Write the prompts and report the warnings and errors of processed lines, in order; True
    when the command must stop (``--on-error raise`` and a bad line)."""
    stop_early = job.args.on_error == "raise"
    out: list[bytes] = []
    stop = False
    for line in lines:
        for text in line.warnings:
            job.report(line.lineno, text)
        if line.error is not None:
            job.report(line.lineno, line.error)
            job.stats.failed += 1
            if stop_early:
                stop = True
                break
            continue
        out.append(line.output)
        job.stats.sizes.append(line.tokens)
        job.stats.dropped_tokens += line.dropped_tokens
    job.dst.write(b"".join(out))
    if job.collector is not None:
        job.collector.add_lines(lines, stop_early)
    return stop


class _Mute(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


_MUTE = _Mute()


def _sanitize(line: Line) -> None:
    """Leave the broken historical tool-call units of the line out before it is built (what the
    builder's sanitize step would do to the prompt), each a warning of this line with input
    positions; a broken newest unit raises ``ToolCallHistoryError`` (the line's error)."""
    from ..message.sanitize import sanitize_tool_call_history_report

    log = logging.getLogger("jianmu_fast.message")
    log.addFilter(_MUTE)  # its own warning would name neither the file nor the line
    try:
        report = sanitize_tool_call_history_report(line.history)
    finally:
        log.removeFilter(_MUTE)
    line.clean = report.messages
    for unit in report.dropped:
        line.warnings.append(f"warning: left out a broken tool-call unit, messages{list(unit.indices)}: {unit.reason}")


def _build_lines(job: Job, states: list[dict[str, Any]]) -> list[Any]:
    """The prompt of each state, or the exception that building it raised."""
    from ..batch import build_batch_report

    def run(batch: list[dict[str, Any]], workers: int) -> list[Any]:
        report = build_batch_report(job.builder, batch, tools_schema=job.tools, workers=workers)
        out: list[Any] = list(report.prompts)
        for f in report.failures:
            out[f.index] = f.error
        return out

    try:
        return run(states, job.args.workers)
    except Exception:  # a failure the batch could not pin on one state: build each alone
        results: list[Any] = []
        for state in states:
            try:
                results.extend(run([state], 1))
            except Exception as exc:
                results.append(exc)
        return results


_MESSAGES_REF = re.compile(r"\bmessages\[(\d+)(?::(\d+))?\]")


def _failing_stage_input(builder: Any, state: Any, tools: Any) -> list[Any]:
    """The messages that the stage of ``builder.build(state)`` that fails received (replayed:
    the providers, then each filter until one raises; after the last, the sanitize step's)."""
    msgs = builder._provide(state, None, None, tools)
    for i in range(len(builder.filters)):
        try:
            msgs = builder._apply_filter(i, msgs, state, None, None, tools)
        except Exception:
            break
    return msgs


def _input_indices(reason: str, job: Job, line: Line) -> str:
    """``reason`` with each ``messages[i]`` / ``messages[i:j]`` that counts prompt positions
    (the messages the CLI's preset adds come first) rewritten as positions in the input line.

    A reference to messages of the input only becomes ``messages[k]`` (``[k:l]``); one that
    takes in messages the preset added says how many, e.g. ``prompt messages[0:4] (3 added by
    the preset, input messages[0])``.
    """
    if "messages[" not in reason:
        return reason
    try:
        seen = _failing_stage_input(job.builder, line.state(), job.tools)
    except Exception:
        return reason
    where = {m.id: i for i, m in enumerate(line.history)}

    def span(ks: list[int]) -> str:
        if len(ks) == 1:
            return f"[{ks[0]}]"
        if ks == list(range(ks[0], ks[-1] + 1)):
            return f"[{ks[0]}:{ks[-1] + 1}]"
        return str(ks)

    def rewrite(m: re.Match[str]) -> str:
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo + 1
        if not lo < hi <= len(seen):
            return m.group(0)
        found = [where.get(x.id) for x in seen[lo:hi]]
        ours = [k for k in found if k is not None]
        added = len(found) - len(ours)
        if not added:
            text = span(ours)
            return f"messages{text if m.group(2) is None or ':' in text else f'[{ours[0]}:{ours[0] + 1}]'}"
        parts = [f"{added} added by the preset"] + ([f"input messages{span(ours)}"] if ours else [])
        return f"prompt messages[{lo}:{hi}] ({', '.join(parts)})"

    return _MESSAGES_REF.sub(rewrite, reason)


def _prompt_body(job: Job, prompt: list[Any]) -> dict[str, Any]:
    """The prompt as the output format writes it: chat-completions ``messages``, or with
    ``--format anthropic`` Anthropic's ``system`` and ``messages`` (``to_anthropic``)."""
    if getattr(job.args, "format", "openai") == "anthropic":
        from ..integrations.anthropic import to_anthropic

        return to_anthropic(prompt)
    return {"messages": [m.to_openai() for m in prompt]}


def _render(job: Job, line: Line, prompt: list[Any]) -> None:
    """Fill ``line.output`` (one strict-JSON UTF-8 line) and its counts."""
    history, counter = line.history, job.counter
    kept = {m.id for m in prompt}  # annotated or filled copies keep the id of the original
    first = line.persona if line.replace_persona else 0
    dropped = [i for i in range(first, len(history)) if history[i].id not in kept]
    line.dropped_tokens = sum(counter.count_message(history[i]) for i in dropped)
    line.tokens = int(counter.count_messages(prompt))
    obj = {**line.rest, **_prompt_body(job, prompt), "prompt_tokens": line.tokens,
           "dropped": {"messages": len(dropped), "tokens": line.dropped_tokens, "indices": dropped}}
    if line.replace_persona:
        obj["replaced_system"] = list(range(line.persona))
    line.output = (json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
