"""The subcommands ``build`` and ``replay``, the parser made of them, and ``main``."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from typing import Any, Callable, Optional, Sequence

from .builder import make_builder, split_persona
from .common import PROG, UsageError, read_text, reason_of
from .options import Parser, add_build_arguments, add_replay_arguments, load_tools, make_counter
from .processing import Job, emit, process
from .reading import CHUNK, CHUNK_WITH_BAR, chunks, input_rows, parse_line
from .writing import Output

__all__ = ["main", "make_parser", "summarize"]


def summarize(sizes: Sequence[int], dropped_tokens: int, failed: int, seconds: float, *, trimming: bool = True) -> str:
    """The end-of-run summary; ``trimming=False`` when the prompts had no limit to keep.

    >>> print(summarize([10, 20, 30, 40], 5, 1, 0.5))
    jianmu-fast: 4 prompts written, 1 line failed, in 0.50 s
      tokens kept 100, dropped 5; prompt size p50 20, p95 40 tokens
    >>> print(summarize([10], 0, 0, 0.1, trimming=False))
    jianmu-fast: 1 prompt written, 0 lines failed, in 0.10 s
      tokens kept 10, nothing trimmed (no --max-tokens or --max-messages); prompt size p50 10, p95 10 tokens
    """
    n = len(sizes)
    s = sorted(sizes)

    def pct(p: float) -> int:  # nearest rank
        return s[max(0, -(-int(p * n) // 100) - 1)] if n else 0

    fail = f"{failed} line{'s' if failed != 1 else ''} failed"
    if trimming:
        kept = f"tokens kept {sum(s)}, dropped {dropped_tokens}"
    else:
        kept = f"tokens kept {sum(s)}, nothing trimmed (no --max-tokens or --max-messages)"
        if dropped_tokens:
            kept += f", {dropped_tokens} tokens of broken tool-call units left out"
    return (
        f"{PROG}: {n} prompt{'s' if n != 1 else ''} written, {fail}, in {seconds:.2f} s\n"
        f"  {kept}; prompt size p50 {pct(50)}, p95 {pct(95)} tokens"
    )


def _progress(total: Optional[int]) -> Any:
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="line", file=sys.stderr, dynamic_ncols=True)


def _count_lines(path: str) -> Optional[int]:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return None

def _build(args: argparse.Namespace) -> int:
    from .. import BACKEND
    from ..errors import JianmuError

    _check_engine(args)
    try:
        counter = make_counter(args.tokenizer, args.content_format)
        builder = make_builder(args, counter)
    except (JianmuError, TypeError, ValueError) as exc:  # a tokenizer or configuration that cannot load
        raise UsageError(f"{type(exc).__name__}: {exc}") from None
    tools = load_tools(args.tools_file) if args.tools_file is not None else None
    tools_tokens = _tools_tokens(args, counter, tools)
    if args.report is not None:
        if args.engine != "local":
            raise UsageError("--report needs --engine local (the Ray engine builds the prompts on its workers, "
                             "where the report's figures are not gathered)")
        _check_report_path(args.report, ("INPUT", args.input), ("-o", args.output))
    src_name = "<stdin>" if args.input == "-" else args.input
    try:
        src = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")
    except OSError as exc:
        raise UsageError(f"INPUT {args.input!r}: {exc.strerror or exc}") from None
    try:
        job = Job(args, builder, counter, Output(args.output, args.input), src_name, tools)
    except UsageError:
        if args.input != "-":
            src.close()
        raise
    if args.report is not None:
        from ..run_stats import RunCollector

        job.collector = RunCollector(builder, counter, src_name=src_name, tools=tools)
    bar = _progress(None if args.input == "-" else _count_lines(args.input))
    stop = False
    processed: Any = None
    try:
        if args.engine == "ray":
            from ..integrations.ray import run_lines

            processed = run_lines(job, chunks(input_rows(args, src), CHUNK))
        else:
            size = CHUNK if bar is None else CHUNK_WITH_BAR
            processed = (process(chunk, job) for chunk in chunks(input_rows(args, src), size))
        for lines in processed:
            stop = emit(lines, job)
            if bar is not None:
                bar.update(len(lines))
            if stop:
                break
    except BaseException:  # interrupted (KeyboardInterrupt), a broken pipe, a bug: keep the old output
        job.dst.abort()
        raise
    else:
        job.dst.commit()
    finally:
        if processed is not None and hasattr(processed, "close"):
            processed.close()  # the Ray engine stops its local instance
        if bar is not None:
            bar.close()
        if args.input != "-":
            src.close()
    stats = job.stats
    seconds = time.perf_counter() - stats.t0
    print(summarize(stats.sizes, stats.dropped_tokens, stats.failed, seconds,
                    trimming=bool(builder.filters)), file=sys.stderr)
    if tools is not None:
        print(f"  tools: {len(tools)} from {args.tools_file}, {tools_tokens} tokens per request"
              f"{', inside --max-tokens' if args.max_tokens is not None else ''}", file=sys.stderr)
    print(f"  backend {BACKEND}, tokenizer {args.tokenizer}, preset {args.preset}", file=sys.stderr)
    if job.collector is not None:
        _write_run_report(job, seconds)
    return 1 if stop else 0

def _check_engine(args: argparse.Namespace) -> None:
    """Usage errors of ``--engine`` / ``--ray-address``, before any line is read."""
    if args.ray_address is not None and args.engine != "ray":
        raise UsageError("--ray-address needs --engine ray")
    if args.engine == "ray":
        try:
            import ray.data  # noqa: F401
        except ImportError:
            raise UsageError("--engine ray needs Ray Data: pip install 'jianmu_fast[ray]'") from None


def _tools_tokens(args: argparse.Namespace, counter: Any, tools: Optional[list[dict[str, Any]]]) -> int:
    """What the tools cost each request; a usage error when they alone leave no room."""
    if not tools:
        return 0
    try:
        cost = int(counter.count_tools(tools))
    except Exception as exc:
        raise UsageError(f"--tools-file {args.tools_file!r}: cannot count the tools: {reason_of(exc)}") from None
    fixed = cost + int(counter.count_messages([]))
    if args.max_tokens is not None and fixed >= args.max_tokens:
        raise UsageError(
            f"--tools-file {args.tools_file!r}: the {len(tools)} tools cost {cost} tokens per request "
            f"({fixed} with the request's fixed cost), which leaves no room for messages within "
            f"--max-tokens {args.max_tokens}; raise --max-tokens or send fewer tools"
        )
    return cost

def _check_report_path(path: str, *others: tuple[str, str]) -> None:
    """``--report PATH`` before anything runs: plotly installed, a folder that exists, and
    none of the run's own files (``others``: ``(flag, path)``)."""
    from ..report_html import EXTRA_HINT, require_plotly

    try:
        require_plotly()
    except ImportError:
        raise UsageError(f"--report {path!r} needs plotly: {EXTRA_HINT}") from None
    real = os.path.realpath(path)
    for flag, other in others:
        if other not in (None, "-") and os.path.realpath(other) == real:
            raise UsageError(f"--report {path!r} is the same file as {flag} {other!r}; write the report elsewhere")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--report {path!r}: no such directory {folder!r}")


def _write_run_report(job: Job, seconds: float) -> None:
    from .. import BACKEND
    from ..report_html import run_report_html, write_html

    args = job.args
    stats = job.collector.finish(seconds, preset=args.preset, tokenizer=args.tokenizer, backend=BACKEND,
                                 workers=str(args.workers), on_error=args.on_error)
    try:
        write_html(args.report, run_report_html(stats))
    except OSError as exc:
        raise UsageError(f"--report {args.report!r}: {exc.strerror or exc}") from None
    print(f"  report written to {args.report}", file=sys.stderr)

def _replay(args: argparse.Namespace) -> int:
    from ..errors import JianmuError
    from ..replay import replay

    if args.report is not None:
        _check_report_path(args.report, ("CONVERSATION", args.conversation))
    try:
        counter = make_counter(args.tokenizer, args.content_format)
        builder = make_builder(args, counter)
    except (JianmuError, TypeError, ValueError) as exc:
        raise UsageError(f"{type(exc).__name__}: {exc}") from None
    tools = load_tools(args.tools_file) if args.tools_file is not None else None
    _tools_tokens(args, counter, tools)
    text = read_text(args.conversation, "CONVERSATION")
    try:
        _, messages = parse_line(text)
    except ValueError as exc:
        raise UsageError(f"CONVERSATION {args.conversation!r}: {reason_of(exc)}") from None
    persona, rest = split_persona(messages)
    replaced = args.system_prompt is not None or args.system_prompt_file is not None
    try:
        result = replay(builder, rest, tools_schema=tools, counter=counter, offset=len(persona),
                        title=os.path.basename(args.conversation),
                        state=(lambda h: {"messages": h}) if replaced else (lambda h: {"messages": h, "persona": persona}))
    except Exception as exc:
        notes = "; ".join(getattr(exc, "__notes__", []))
        print(f"{PROG}: {args.conversation}: {reason_of(exc)}{f' ({notes})' if notes else ''}", file=sys.stderr)
        return 1
    st = result.stats
    if args.format == "json":
        print(json.dumps({"turns": st.turns, "prefix_hits": st.prefix_hits, "prefix_hit_rate": st.prefix_hit_rate,
                          "total_tokens": st.total_tokens, "cached_tokens": st.cached_tokens,
                          "cached_token_share": st.cached_token_share, "budget": result.budget,
                          "per_turn": [{"history": t.history, "prompt_tokens": p.prompt_tokens,
                                        "billed_tokens": t.billed_tokens, "cached_tokens": p.cached_tokens,
                                        "prefix_hit": p.prefix_hit, "first_kept": t.first_kept,
                                        "removed": [list(x) for x in t.removed]}
                                       for t, p in zip(result.turns, st.per_turn)]}))
    else:
        print(result.to_text())
    if args.report is not None:
        try:
            result.to_html(args.report)
        except OSError as exc:
            raise UsageError(f"--report {args.report!r}: {exc.strerror or exc}") from None
        print(f"{PROG}: report written to {args.report}", file=sys.stderr)
    return 0


#: The subcommands: name -> (one-line help, the function that adds its arguments (its docstring
#: is the command's description), the function that runs it and returns the exit status).
_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "build": ("turn a JSONL file of conversations into a JSONL file of prompts", add_build_arguments, _build),
    "replay": ("replay one conversation turn by turn: prompt sizes and prefix-cache hits", add_replay_arguments,
               _replay),
}

def make_parser() -> argparse.ArgumentParser:
    """The ``jianmu-fast`` parser: one subparser per entry of ``_COMMANDS``."""
    from .. import BACKEND, __version__

    parser = Parser(prog=PROG, description="Assemble LLM prompts with jianmu_fast.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__} (backend {BACKEND})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, (summary, add_arguments, run) in _COMMANDS.items():
        command = sub.add_parser(name, help=summary, description=add_arguments.__doc__)
        add_arguments(command)
        command.set_defaults(run=run)
    return parser

def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``jianmu-fast`` console script; returns the exit status."""
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args))
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `jianmu-fast build x.jsonl | head`
        with contextlib.suppress(OSError):  # no second error when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
