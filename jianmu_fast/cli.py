"""The ``jianmu-fast`` command line: a JSONL file of conversations in, a JSONL file of prompts out.

::

    jianmu-fast build INPUT.jsonl -o OUTPUT.jsonl [--preset chat|react|skill]
        [--system-prompt TEXT | --system-prompt-file PATH] [--tools-desc-file PATH]
        [--tools-file PATH] [--skills-dir DIR] [--workspace-dir DIR] [--max-messages N]
        [--max-tokens N] [--tokenizer simple|ENCODING|MODEL|PATH/tokenizer.json]
        [--workers N] [--on-error raise|skip] [--format openai|anthropic]
    jianmu-fast --version

``-`` reads stdin / writes stdout (``-o`` defaults to stdout). Each input line is a
conversation: ``{"messages": [...], ...}`` (chat-completions dicts; the other keys are carried
through) or a bare list of messages. Lines are read as bytes and end at ``\\n``; blank lines
are ignored. Each output line is the input object with ``messages`` replaced by the prompt,
plus ``prompt_tokens`` (the prompt's messages counted by ``--tokenizer``) and ``dropped``:
``{"messages": k, "tokens": t, "indices": [...]}`` (the positions of the input messages that
are not in the prompt, and what they cost). Output lines are strict JSON in UTF-8.
With ``--format anthropic`` lines are Anthropic requests, ``{"system": ..., "messages": [...]}``
in and out (``jianmu_fast.integrations.anthropic``; ``dropped`` positions count the converted
messages: the system first, each ``tool_result`` on its own).

**One persona.** The input's leading system messages are the prompt's persona, in the place
of the preset's default persona. ``--system-prompt`` (or ``--system-prompt-file``) replaces
them: the prompt starts with that text, and each output line lists the replaced positions in
``replaced_system``. An input with no leading system message gets the configured default
persona (``prompt.persona_default_prompt``). A prompt never carries two personas.

**Tools.** ``--tools-file`` is a JSON list of OpenAI tool schemas; they are passed to the
builder as ``tools_schema``, so ``--max-tokens`` is the budget of the whole request
(messages, chat overhead and tools). The summary gives what the tools cost.

**Bad lines.** Whatever one line's content makes fail (bytes that are not UTF-8, JSON that
is malformed, nested too deeply or holds ``NaN``/``Infinity``/an out-of-range number, a lone
surrogate, an invalid message, a broken newest tool-call transaction, a prompt that cannot
fit) is reported on stderr as ``INPUT:LINE: reason``, with message positions of the input line.
Broken historical tool-call units are left out of the prompt with an ``INPUT:LINE: warning``.
With ``--on-error raise`` (the default) the command stops at the first bad line and exits 1:
the output holds the prompts of every line before it, and nothing is built or reported for
later lines. With ``--on-error skip`` the bad line is left out, the others are written in
order, and the exit status is 0.

**Files.** ``-o FILE`` is written to a temporary file in its directory that replaces FILE
when the run ends (keeping FILE's permission bits), also after a bad line under ``raise``; an
interrupted run (Ctrl-C: exit 130) leaves a previous FILE untouched. An output that is the
input file (same file by device and inode: a symlink or hard link too) is refused. On stdout
only whole lines are written, Ctrl-C included.

Usage errors (bad flags or ranges, an unreadable file, a tokenizer that cannot load, a bad
``--tools-file``) exit 2 before any line is read. A summary goes to stderr at the end, and a
tqdm progress bar too when stderr is a terminal and tqdm (the ``cli`` extra) is installed.

>>> main(["build", "--help"]) == 0  # doctest: +ELLIPSIS
usage: jianmu-fast build ...
True
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import logging
import os
import re
import signal
import stat
import sys
import tempfile
import threading
import time
from typing import IO, Any, Callable, Iterator, NoReturn, Optional, Sequence

__all__ = [
    "main", "make_counter", "make_builder", "load_tools", "InputPersonaProvider", "split_persona", "summarize",
    "spec_namespace", "process_conversations", "ConversationResult",
]

PROG = "jianmu-fast"
_CHUNK = 4096  # lines per batch: bounds memory, and the output streams as it goes
_CHUNK_WITH_BAR = 512  # smaller batches when a progress bar is shown, so that it moves


class UsageError(Exception):
    """A bad command line or an unreadable input (exit status 2)."""


#: What ``--tokenizer`` accepts: ``(form, what it means)``. The flag's help and every
#: tokenizer error list these; a new form is one more entry here and one more case in
#: ``make_counter``.
TOKENIZER_FORMS: list[tuple[str, str]] = [
    ("simple", "about 4 characters a token, no tokenizer needed"),
    ("an encoding or model name", "a tiktoken encoding such as o200k_base or cl100k_base, or a model name such "
     "as gpt-4o or gpt-4"),
    ("a path to a tokenizer.json", "a HuggingFace tokenizer file, e.g. models/qwen/tokenizer.json"),
    ("a model directory", "a local folder with tokenizer.json and a chat template (tokenizer_config.json or "
     "chat_template.jinja): the exact count of the model's chat template, e.g. models/qwen"),
]


def _tokenizer_error(spec: str, reason: str) -> UsageError:
    forms = "\n".join(f"  {form}: {what}" for form, what in TOKENIZER_FORMS)
    return UsageError(f"--tokenizer {spec!r}: {reason}\n--tokenizer accepts:\n{forms}")


def make_counter(spec: str) -> Any:
    """The token counter for ``--tokenizer`` (the forms of ``TOKENIZER_FORMS``); a
    ``UsageError`` that lists every accepted form when ``spec`` is none of them.

    >>> make_counter("simple")
    SimpleTokenCounter(chars_per_token=4)
    >>> make_counter("gpt-4o")
    TiktokenTokenCounter('o200k_base')
    """
    from .errors import JianmuError
    from .memory.context import HFTokenCounter, SimpleTokenCounter, TiktokenTokenCounter

    try:
        if spec == "simple":
            return SimpleTokenCounter()
        if os.path.isdir(spec):
            from .memory.context import ChatTemplateTokenCounter
            from .memory.context.chat_template import has_chat_template

            return ChatTemplateTokenCounter(spec) if has_chat_template(spec) else HFTokenCounter(spec)
        if spec.endswith(".json") or os.sep in spec or os.path.exists(spec):
            if not os.path.isfile(spec):
                raise _tokenizer_error(spec, "no such tokenizer.json file")
            return HFTokenCounter(spec)
        return TiktokenTokenCounter(spec)
    except (JianmuError, ValueError, TypeError, OSError, ImportError) as exc:
        raise _tokenizer_error(spec, str(exc)) from None


def _read_text(path: str, flag: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UsageError(f"{flag} {path!r}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{flag} {path!r}: not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start}") from None


def load_tools(path: str) -> list[dict[str, Any]]:
    """The ``--tools-file``: a JSON list of tool schemas in the OpenAI form
    ``{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}``.
    Raises ``UsageError`` naming the file and the index of a bad entry.

    >>> import json, pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "tools.json"
    >>> _ = p.write_text(json.dumps([{"type": "function", "function": {"name": "calc"}}]))
    >>> [t["function"]["name"] for t in load_tools(str(p))]
    ['calc']
    >>> _ = p.write_text(json.dumps([{"type": "function", "function": {"name": ""}}]))
    >>> load_tools(str(p))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    jianmu_fast.cli.UsageError: --tools-file '...tools.json': tools[0].function.name: expected a non-empty string, got ''
    """
    where = f"--tools-file {path!r}"
    text = _read_text(path, "--tools-file")
    try:
        tools = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{where}: {_reason(exc)}") from None
    if not isinstance(tools, list):
        raise UsageError(f"{where}: expected a JSON list of tools, got {_json_type(tools)}")
    for i, tool in enumerate(tools):
        at = f"{where}: tools[{i}]"
        if not isinstance(tool, dict):
            raise UsageError(f"{at}: expected an object {{\"type\": \"function\", \"function\": {{...}}}}, "
                             f"got {_json_type(tool)}")
        if tool.get("type") != "function":
            raise UsageError(f"{at}.type: expected \"function\", got {json.dumps(tool.get('type'))}")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise UsageError(f"{at}.function: expected an object with a name, got {_json_type(fn)}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise UsageError(f"{at}.function.name: expected a non-empty string, got {fn.get('name')!r}")
        for key, kind in (("description", str), ("parameters", dict)):
            if key in fn and not isinstance(fn[key], kind):
                raise UsageError(f"{at}.function.{key}: expected {'a string' if kind is str else 'an object'}, "
                                 f"got {_json_type(fn[key])}")
    return tools


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


class InputPersonaProvider:
    """The persona of a command-line prompt: the state's ``"persona"`` messages (the input
    line's leading system messages) when it has any, else those of ``default`` (the preset's
    persona provider: ``--system-prompt``, or the configured default persona). Never both.

    >>> from jianmu_fast.memory.context import StaticPromptProvider
    >>> from jianmu_fast.message import system
    >>> p = InputPersonaProvider(StaticPromptProvider("You are a helpful assistant."))
    >>> [m.content for m in p.get_messages({"messages": [], "persona": [system("You are Jianmu.")]})]
    ['You are Jianmu.']
    >>> [m.content for m in p.get_messages({"messages": []})]
    ['You are a helpful assistant.']
    """

    def __init__(self, default: Any) -> None:
        self.default = default

    def __repr__(self) -> str:
        return f"InputPersonaProvider({self.default!r})"

    def get_messages(self, local_state: Any, global_state: Any = None, ctx: Any = None) -> list[Any]:
        persona = local_state.get("persona") if isinstance(local_state, dict) else None
        if persona:
            return list(persona)
        return list(self.default.get_messages(local_state, global_state, ctx))


def split_persona(messages: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """``(leading system messages, the rest)`` of an input conversation.

    >>> from jianmu_fast.message import system, human
    >>> [[m.content for m in part] for part in split_persona([system("a"), system("b"), human("c"), system("d")])]
    [['a', 'b'], ['c', 'd']]
    """
    k = 0
    while k < len(messages) and messages[k].role == "system":
        k += 1
    return list(messages[:k]), list(messages[k:])


def make_builder(args: argparse.Namespace, counter: Any) -> Any:
    """The ``ContextBuilder`` of the preset and options in ``args``.

    >>> ns = _parser().parse_args(["build", "-", "--preset", "react", "--max-tokens", "500"])
    >>> b = make_builder(ns, make_counter("simple"))
    >>> [type(p).__name__ for p in b.providers], [type(f).__name__ for f in b.filters]
    (['InputPersonaProvider', 'StaticPromptProvider', 'StateHistoryProvider'], ['TokenBudgetFilter'])
    >>> ns = _parser().parse_args(["build", "-", "--max-tokens", "8000", "--tool-result-max-tokens", "2000",
    ...                            "--clear-tool-results", "3"])
    >>> [type(f).__name__ for f in make_builder(ns, make_counter("simple")).filters]
    ['ToolResultCapFilter', 'ClearToolResultsFilter', 'TokenBudgetFilter']
    """
    from .memory.context import ContextBuilder, PromptRuntimeContext

    system_prompt = args.system_prompt
    if args.system_prompt_file is not None:
        system_prompt = _read_text(args.system_prompt_file, "--system-prompt-file")
    tools_desc = getattr(args, "tools_desc", None)
    if args.tools_desc_file:
        tools_desc = _read_text(args.tools_desc_file, "--tools-desc-file")
    if args.skills_dir is not None and args.preset != "skill":
        raise UsageError("--skills-dir needs --preset skill (the chat and react presets ignore skills)")
    if tools_desc is not None and args.preset == "chat":
        raise UsageError("--tools-desc-file needs --preset react or skill (the chat preset has no tools)")
    for flag, d in (("--skills-dir", args.skills_dir), ("--workspace-dir", args.workspace_dir)):
        if d is not None and not os.path.isdir(d):
            raise UsageError(f"{flag} {d!r}: not a directory")
    runtime = None
    if args.workspace_dir is not None or args.skills_dir is not None:
        runtime = PromptRuntimeContext(
            workspace_dir=args.workspace_dir,
            include_bootstrap_files=args.workspace_dir is not None,
            skills_dir=args.skills_dir,
        )
    common = dict(system_prompt=system_prompt, max_messages=args.max_messages, max_tokens=args.max_tokens,
                  runtime_prompt=runtime, token_counter=counter)
    editing = dict(tool_result_max_tokens=getattr(args, "tool_result_max_tokens", None),
                   clear_tool_results=getattr(args, "clear_tool_results", None))
    if editing["clear_tool_results"] is not None and args.max_tokens is None:
        raise UsageError("--clear-tool-results clears once a prompt is over --max-tokens: pass --max-tokens too")
    if args.preset == "chat":
        preset = ContextBuilder.for_chat(**common)
    elif args.preset == "react":
        preset = ContextBuilder.for_react(**common, tools_desc=tools_desc, **editing)
    else:
        preset = ContextBuilder.for_skill(**common, tools_desc=tools_desc)
    filters = preset.filters
    if args.preset != "react":  # the react preset adds the context-editing stages itself
        from .memory.context.presets import _editing_filters

        filters = _editing_filters(filters, args.max_tokens, counter, summarize=None, **editing)
    # every preset starts with its persona provider; the input's own persona takes its place
    providers = [InputPersonaProvider(preset.providers[0]), *preset.providers[1:]]
    return ContextBuilder(providers=providers, filters=filters, sanitize=preset.sanitize)


MAX_LIMIT = 1_000_000_000  # the largest --max-tokens / --max-messages: far beyond any context window
MAX_WORKERS = 256


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer from ``lo`` to ``hi``, or a usage error saying so.

    >>> _int_in(1, 10)("7")
    7
    >>> _int_in(1, 10)("99999999999999999999999")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected an integer from 1 to 10, got '99999999999999999999999'
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = lo - 1
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer from {lo:,} to {hi:,}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


class _Parser(argparse.ArgumentParser):
    """``argparse`` with no abbreviated flags, and a suggestion for a misspelt one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _all_options(self) -> list[str]:
        out: list[str] = []
        for action in self._actions:
            out += [o for o in action.option_strings if o.startswith("--")]
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    out += _Parser._all_options(sub)
        return sorted(set(out))

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        if message.startswith("unrecognized arguments: "):
            options = self._all_options()
            hints = []
            for word in message.split(": ", 1)[1].split():
                name = word.split("=", 1)[0]
                if not name.startswith("-"):
                    continue
                close = difflib.get_close_matches(name.replace("_", "-").lower(), options, n=1, cutoff=0.6)
                if close:
                    hints.append(f"{name}: did you mean {close[0]}?")
            if hints:
                message += "\n" + "\n".join(hints)
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    """The ``jianmu-fast`` parser: one subparser per entry of ``_COMMANDS``."""
    from . import BACKEND, __version__

    parser = _Parser(prog=PROG, description="Assemble LLM prompts with jianmu_fast.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__} (backend {BACKEND})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name, (summary, add_arguments, run) in _COMMANDS.items():
        command = sub.add_parser(name, help=summary, description=add_arguments.__doc__)
        add_arguments(command)
        command.set_defaults(run=run)
    return parser


def _tokenizer_help() -> str:
    return "; ".join(f"{form} ({what})" for form, what in TOKENIZER_FORMS)


def _add_build_arguments(b: argparse.ArgumentParser) -> None:
    """Turn a JSONL file of conversations into a JSONL file of prompts. Each prompt has one
    persona: the input's leading system messages, or --system-prompt in their place. A bad line
    is reported on stderr with its line number; --on-error decides whether the command stops
    there (exit 1, prompts of earlier lines kept) or skips it (exit 0). Output lines are strict
    JSON: a line holding NaN, Infinity or a number out of range is refused (a bad line), never
    changed."""
    b.add_argument("input", metavar="INPUT", help="input JSONL file, or - for stdin")
    b.add_argument("-o", "--output", default="-", metavar="OUTPUT",
                   help="output JSONL file (replaced when the run ends; never the input), or - for stdout (default)")
    b.add_argument("--preset", choices=("chat", "react", "skill"), default="chat", help="builder preset (default chat)")
    sp = b.add_mutually_exclusive_group()
    sp.add_argument("--system-prompt", metavar="TEXT",
                    help="the persona, in place of each input's leading system messages (default: those are "
                    "the persona; an input without any gets the configured default persona)")
    sp.add_argument("--system-prompt-file", metavar="PATH", help="read --system-prompt from a file")
    b.add_argument("--tools-desc-file", metavar="PATH", help="tool descriptions (react and skill presets)")
    b.add_argument("--tools-file", metavar="PATH",
                   help="the request's tools: a JSON list of OpenAI tool schemas "
                   '({"type": "function", "function": {...}}); --max-tokens then budgets the whole request, '
                   "tools included")
    b.add_argument("--skills-dir", metavar="DIR", help="directory of SKILL.md skills (skill preset)")
    b.add_argument("--workspace-dir", metavar="DIR", help="workspace root: its bootstrap files (AGENTS.md) are included")
    b.add_argument("--max-messages", type=_int_in(1, MAX_LIMIT), metavar="N",
                   help="keep at most N non-pinned messages (1 to 1,000,000,000)")
    b.add_argument("--max-tokens", type=_int_in(1, MAX_LIMIT), metavar="N",
                   help="token budget of each prompt (1 to 1,000,000,000)")
    b.add_argument("--tool-result-max-tokens", type=_int_in(1, MAX_LIMIT), metavar="N",
                   help="cut each tool result over N tokens to its head and tail around a marker (ToolResultCapFilter)")
    b.add_argument("--clear-tool-results", type=_int_in(0, MAX_LIMIT), metavar="KEEP",
                   help="over --max-tokens, replace old tool results by '[cleared]', all but the KEEP newest, "
                        "in steps of a quarter of --max-tokens (ClearToolResultsFilter; needs --max-tokens)")
    b.add_argument("--tokenizer", default="o200k_base", metavar="NAME",
                   help=f"how tokens are counted (default o200k_base): {_tokenizer_help()}")
    b.add_argument("--workers", type=_int_in(1, MAX_WORKERS), default=1, metavar="N",
                   help="worker processes (1 to 256, default 1)")
    b.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                   help="on a bad line: stop with exit status 1 (raise, default) or leave it out (skip)")
    b.add_argument("--report", metavar="FILE.html",
                   help="also write a self-contained HTML report of the run: prompt sizes against the budget, "
                   "tokens per section, messages dropped, the largest messages, repairs and failures with "
                   "FILE:LINE, where the time went (needs jianmu_fast[report])")
    b.add_argument("--format", choices=("openai", "anthropic"), default="openai",
                   help="message format of input and output lines: chat-completions (default) or Anthropic "
                        "requests ({\"system\": ..., \"messages\": [...]})")
    b.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="where prompts are built: this process and its --workers (local, default), or Ray Data "
                        "(ray: the jianmu_fast[ray] extra; same output, same errors)")
    b.add_argument("--ray-address", metavar="ADDRESS",
                   help="with --engine ray: a running cluster (HOST:PORT, or 'auto'); default: start a local "
                        "Ray instance. Token-authenticated clusters read RAY_AUTH_TOKEN or the token file")


# -- reading ----------------------------------------------------------------------------------


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # where a lone surrogate can come from
_BOM = b"\xef\xbb\xbf"


def _decode(raw: bytes, lineno: int) -> str:
    """The text of one input line; ValueError naming the first byte that is not UTF-8."""
    if lineno == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"not UTF-8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1} ({exc.reason})"
        ) from None


def _lone_surrogate(obj: Any, root: str = "") -> Optional[str]:
    """Where the first string (or key) of ``obj`` holding a lone surrogate is, with the
    character; None when there is none. Iterative, so any depth ``json.loads`` accepts works.

    >>> _lone_surrogate({"messages": [{"content": "ok"}, {"content": "a\\ud800"}]})
    'messages[1].content: a lone surrogate \\\\ud800'
    """
    stack: list[tuple[str, Any]] = [(root, obj)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"{path or 'the line'}: a lone surrogate \\u{ord(item[exc.start]):04x}"
        elif isinstance(item, dict):
            for key in reversed(list(item)):
                bad = _lone_surrogate(key)
                if bad is not None:
                    return f"{path or 'the line'}: a key with {bad.split(': ', 1)[1]}"
                stack.append((f"{path}.{key}" if path else key, item[key]))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"not strict JSON: {name} (JSON has no NaN or Infinity; the line is refused, not changed)")


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"not strict JSON: the number {text} is out of range (it would be written as "
                         "Infinity; the line is refused, not changed)")
    return value


def _parse_line(text: str, fmt: str = "openai") -> tuple[dict[str, Any], Any]:
    """``(other keys, messages)`` of one line; raises ValueError with the reason. With
    ``fmt="anthropic"`` the line is an Anthropic request (``messages`` and ``system``)."""
    from .message import coerce_messages

    try:
        obj = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
    if _SURROGATE_ESCAPE.search(text) is not None:
        where = _lone_surrogate(obj, "messages" if isinstance(obj, list) else "")
        if where is not None:
            raise ValueError(f"{where} (half of a UTF-16 pair) is not valid Unicode and cannot be written as UTF-8")
    if isinstance(obj, list):
        rest: dict[str, Any] = {}
        raw = obj
    elif isinstance(obj, dict):
        if "messages" not in obj:
            raise ValueError("not a conversation: an object needs a 'messages' list")
        rest = dict(obj)
        raw = rest.pop("messages")
        if not isinstance(raw, list):
            raise ValueError(f"not a conversation: 'messages' must be a list, got {type(raw).__name__}")
    else:
        raise ValueError(f"not a conversation: expected an object or a list, got {type(obj).__name__}")
    if fmt == "anthropic":
        from .integrations.anthropic import from_anthropic

        return rest, from_anthropic(raw, rest.pop("system", None))
    return rest, coerce_messages(raw, "messages")


def _reason(exc: BaseException) -> str:
    """What a line's error says: our own ValueErrors bare, anything else with its type."""
    if isinstance(exc, RecursionError):
        return "nested too deeply to process (RecursionError)"
    return str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"


def _input_rows(args: argparse.Namespace, stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """The input's lines: a JSONL stream's, or for a ``.parquet`` INPUT each row as a JSON line
    (its number is the row's, from 1), read with pyarrow (``--engine local``) or Ray Data
    (``--engine ray``). Arrow gives every message struct all the fields of the column, unset
    ones null: those are left out of the messages, so a row reads as the JSONL line it came from."""
    if not args.input.endswith(".parquet"):
        return _lines(stream)
    return _parquet_rows(args.input, args.engine)


def _parquet_rows(path: str, engine: str) -> Iterator[tuple[int, bytes]]:
    if engine == "ray":
        import ray.data

        batches = ray.data.read_parquet(path).iter_batches(batch_size=_CHUNK, batch_format="pyarrow")
    else:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError("a .parquet INPUT needs pyarrow: pip install 'jianmu_fast[ray]'") from None
        batches = pq.ParquetFile(path).iter_batches(batch_size=_CHUNK)
    n = 0
    for batch in batches:
        for row in batch.to_pylist():
            n += 1
            if isinstance(row.get("messages"), list):
                row["messages"] = [_drop_nulls(m) for m in row["messages"]]
            try:
                yield n, json.dumps(row, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")
            except (TypeError, ValueError) as exc:  # a value JSON cannot hold (bytes, a date): this row's error
                yield n, f"\x00{type(exc).__name__}: {exc}".encode("utf-8", "replace")


def _drop_nulls(value: Any) -> Any:
    """``value`` without ``None``-valued keys, recursively: what a message struct Arrow filled
    in with the column's other fields reads as (lists, tuples and numpy arrays of structs too).

    >>> _drop_nulls([{"role": "user", "content": "hi", "tool_calls": None}])
    [{'role': 'user', 'content': 'hi'}]
    """
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_drop_nulls(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy arrays of structs
        return _drop_nulls(value.tolist())
    return value


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of each non-blank line (lines end at ``\\n`` only)."""
    for lineno, raw in enumerate(stream, 1):
        if raw.strip():
            yield lineno, raw


def _chunks(it: Iterator[tuple[int, bytes]], size: int) -> Iterator[list[tuple[int, bytes]]]:
    chunk: list[tuple[int, bytes]] = []
    for item in it:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# -- writing ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold back SIGINT (Ctrl-C) until the block ends, so a write is never cut mid-line.

    Only in the main thread (where Python runs signal handlers); elsewhere a no-op. A SIGINT
    that arrived inside the block is handed to the previous handler when it ends (by default
    ``KeyboardInterrupt``).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, caught[0])
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _input_stat(path: str) -> Optional[os.stat_result]:
    """``os.stat`` of the input (of stdin when ``-`` and it is a regular file), or None."""
    try:
        if path != "-":
            return os.stat(path)
        st = os.fstat(sys.stdin.fileno())
        return st if stat.S_ISREG(st.st_mode) else None
    except (OSError, ValueError, AttributeError):  # no such file (reported later), no real stdin
        return None


class _Output:
    """Where the prompts go.

    - ``-``: stdout. Only whole lines are written: each chunk of lines goes out in one write
      that SIGINT cannot interrupt.
    - A regular file (or a new path): lines go to a temporary file in the target's directory,
      which replaces the target (``os.replace``) when the run ends, with the previous file's
      permission bits (a new file gets ``0o666 & ~umask``). ``abort()`` (an interrupted run)
      removes it, so a previous output is never left half-written. A symlink target is
      written through: the file it points to is replaced.
    - Anything else that exists (``/dev/null``, a FIFO): written directly.

    Refuses (``UsageError``) an output that is the input file, whatever the name (same
    device and inode: the same path, a symlink or a hard link to it).
    """

    def __init__(self, path: str, input_path: str) -> None:
        self.path = path
        self._tmp: Optional[str] = None
        self._target = path
        self._mode: Optional[int] = None
        if path == "-":
            self._stream: Any = getattr(sys.stdout, "buffer", None)
            return
        try:
            st: Optional[os.stat_result] = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise UsageError(f"-o {path!r}: {exc.strerror or exc}") from None
        src = _input_stat(input_path)
        if st is not None and src is not None and _same_file(st, src):
            what = "standard input" if input_path == "-" else f"the input {input_path!r}"
            raise UsageError(
                f"-o {path!r} is the same file as {what}: writing it would destroy the input. "
                "Write the prompts to another path."
            )
        if st is not None and not stat.S_ISREG(st.st_mode):
            self._stream = self._open(path, "wb")
            return
        self._target = os.path.realpath(path)
        self._mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
        directory = os.path.dirname(self._target)
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=f".{os.path.basename(self._target)}.", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise UsageError(f"-o {path!r}: cannot create a file in {directory!r}: {exc.strerror or exc}") from None
        self._stream = os.fdopen(fd, "wb")

    @staticmethod
    def _open(path: str, mode: str) -> Any:
        try:
            return open(path, mode)
        except OSError as exc:
            raise UsageError(f"-o {path!r}: {exc.strerror or exc}") from None

    def write(self, data: bytes) -> None:
        """Write ``data`` (whole lines); SIGINT waits until it is written and flushed."""
        if not data:
            return
        with _sigint_deferred():
            if self._stream is None:  # a text-only stdout (an embedding application)
                sys.stdout.write(data.decode("utf-8"))
                sys.stdout.flush()
            else:
                if self.path == "-":
                    sys.stdout.flush()
                view = memoryview(data)
                while view:  # a write interrupted by a signal can return early, having written part
                    written = self._stream.write(view)
                    view = view[len(view) if written is None else written:]
                self._stream.flush()

    def commit(self) -> None:
        """The run ended (normally or at a bad line): put the file in place."""
        if self.path == "-":
            return
        if self._tmp is not None:
            os.fsync(self._stream.fileno())  # the data is on disk before the name points at it
        self._stream.close()
        if self._tmp is not None:
            assert self._mode is not None
            os.chmod(self._tmp, self._mode)
            os.replace(self._tmp, self._target)
            self._tmp = None

    def abort(self) -> None:
        """The run was interrupted or crashed: leave whatever was at the target untouched."""
        if self.path == "-":
            return
        with contextlib.suppress(OSError):
            self._stream.close()
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            self._tmp = None


# -- the command ------------------------------------------------------------------------------


class _Stats:
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.dropped_tokens = 0
        self.dropped_messages = 0
        self.failed = 0
        self.t0 = time.perf_counter()


class _Line:
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


class _Job:
    """What every chunk of a ``build`` run shares."""

    def __init__(self, args: argparse.Namespace, builder: Any, counter: Any, dst: _Output, src_name: str,
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
    from . import BACKEND
    from .errors import JianmuError

    _check_engine(args)
    try:
        counter = make_counter(args.tokenizer)
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
        job = _Job(args, builder, counter, _Output(args.output, args.input), src_name, tools)
    except UsageError:
        if args.input != "-":
            src.close()
        raise
    if args.report is not None:
        from .run_stats import RunCollector

        job.collector = RunCollector(builder, counter, src_name=src_name, tools=tools)
    bar = _progress(None if args.input == "-" else _count_lines(args.input))
    stop = False
    processed: Any = None
    try:
        if args.engine == "ray":
            from .integrations.ray import run_lines

            processed = run_lines(job, _chunks(_input_rows(args, src), _CHUNK))
        else:
            size = _CHUNK if bar is None else _CHUNK_WITH_BAR
            processed = (_process(chunk, job) for chunk in _chunks(_input_rows(args, src), size))
        for lines in processed:
            stop = _emit(lines, job)
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
    args = _parser().parse_args(["build", "-", "--on-error", "skip"])
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

    def __init__(self, line: _Line) -> None:
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

    >>> from jianmu_fast.memory.context import ContextBuilder, SimpleTokenCounter
    >>> c = SimpleTokenCounter()
    >>> b = make_builder(spec_namespace({"system_prompt": "Be brief."}), c)
    >>> [r.messages for r in process_conversations([[{"role": "user", "content": "hi"}]], b, c)]
    [[{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}]]
    """
    if args is None:
        args = spec_namespace({})
    job = _Job(args, builder, counter, None, "<conversations>", tools_schema)  # type: ignore[arg-type]
    lines: dict[int, _Line] = {}
    chunk = []
    for i, conv in enumerate(conversations):
        obj = conv if isinstance(conv, dict) else {"messages": conv}
        try:  # the conversation as an input line, so that it is read exactly as the command reads one
            chunk.append((i + 1, json.dumps(obj, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")))
        except (TypeError, ValueError) as exc:  # not JSON data (an object, NaN): this row's error
            lines[i + 1] = _Line(i + 1, False)
            lines[i + 1].error = f"not a conversation: {_reason(exc)}"
    for line in _process(chunk, job):
        lines[line.lineno] = line
    return [ConversationResult(lines[i + 1]) for i in range(len(conversations))]


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
        raise UsageError(f"--tools-file {args.tools_file!r}: cannot count the tools: {_reason(exc)}") from None
    fixed = cost + int(counter.count_messages([]))
    if args.max_tokens is not None and fixed >= args.max_tokens:
        raise UsageError(
            f"--tools-file {args.tools_file!r}: the {len(tools)} tools cost {cost} tokens per request "
            f"({fixed} with the request's fixed cost), which leaves no room for messages within "
            f"--max-tokens {args.max_tokens}; raise --max-tokens or send fewer tools"
        )
    return cost


def _run_chunk(chunk: list[tuple[int, bytes]], job: _Job) -> bool:
    """Build and write one chunk of lines; True when the command must stop (``--on-error raise``)."""
    return _emit(_process(chunk, job), job)


def _process(chunk: list[tuple[int, bytes]], job: _Job) -> list[_Line]:
    """Parse, build and render one chunk of lines (nothing is written or reported here: the Ray
    engine runs this on its workers).

    Whatever one line's content makes fail (its bytes, its JSON, its messages, its prompt,
    rendering it) is that line's error; under ``raise``, lines after the first bad one are
    neither built nor reported.
    """
    stop_early = job.args.on_error == "raise"
    lines: list[_Line] = []
    replace = job.args.system_prompt is not None or job.args.system_prompt_file is not None
    for lineno, raw in chunk:
        line = _Line(lineno, replace)
        lines.append(line)
        try:
            line.rest, line.history = _parse_line(_decode(raw, lineno), getattr(job.args, "format", "openai"))
            line.persona = len(split_persona(line.history)[0])
            _sanitize(line)
        except Exception as exc:  # MessageValidationError is a ValueError too
            line.error = _reason(exc)
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
            line.error = _input_indices(_reason(result), job, line)
            continue
        try:
            _render(job, line, result)
        except Exception as exc:  # e.g. a value that is not strict JSON
            line.error = _reason(exc)
    return lines


def _emit(lines: Sequence[_Line], job: _Job) -> bool:
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


def _sanitize(line: _Line) -> None:
    """Leave the broken historical tool-call units of the line out before it is built (what the
    builder's sanitize step would do to the prompt), each a warning of this line with input
    positions; a broken newest unit raises ``ToolCallHistoryError`` (the line's error)."""
    from .message.sanitize import sanitize_tool_call_history_report

    log = logging.getLogger("jianmu_fast.message")
    log.addFilter(_MUTE)  # its own warning would name neither the file nor the line
    try:
        report = sanitize_tool_call_history_report(line.history)
    finally:
        log.removeFilter(_MUTE)
    line.clean = report.messages
    for unit in report.dropped:
        line.warnings.append(f"warning: left out a broken tool-call unit, messages{list(unit.indices)}: {unit.reason}")


def _build_lines(job: _Job, states: list[dict[str, Any]]) -> list[Any]:
    """The prompt of each state, or the exception that building it raised."""
    from .batch import build_batch_report

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


def _input_indices(reason: str, job: _Job, line: _Line) -> str:
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


def _prompt_body(job: _Job, prompt: list[Any]) -> dict[str, Any]:
    """The prompt as the output format writes it: chat-completions ``messages``, or with
    ``--format anthropic`` Anthropic's ``system`` and ``messages`` (``to_anthropic``)."""
    if getattr(job.args, "format", "openai") == "anthropic":
        from .integrations.anthropic import to_anthropic

        return to_anthropic(prompt)
    return {"messages": [m.to_openai() for m in prompt]}


def _render(job: _Job, line: _Line, prompt: list[Any]) -> None:
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


# -- reports and replay ---------------------------------------------------------------------


def _check_report_path(path: str, *others: tuple[str, str]) -> None:
    """``--report PATH`` before anything runs: plotly installed, a folder that exists, and
    none of the run's own files (``others``: ``(flag, path)``)."""
    from .report_html import EXTRA_HINT, require_plotly

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


def _write_run_report(job: _Job, seconds: float) -> None:
    from . import BACKEND
    from .report_html import run_report_html, write_html

    args = job.args
    stats = job.collector.finish(seconds, preset=args.preset, tokenizer=args.tokenizer, backend=BACKEND,
                                 workers=str(args.workers), on_error=args.on_error)
    try:
        write_html(args.report, run_report_html(stats))
    except OSError as exc:
        raise UsageError(f"--report {args.report!r}: {exc.strerror or exc}") from None
    print(f"  report written to {args.report}", file=sys.stderr)


#: ``build``'s options that ``replay`` does not take (the rest, the builder's, it shares).
_NOT_REPLAY = frozenset({"help", "input", "output", "workers", "on_error", "format", "engine", "ray_address", "report"})


def _add_replay_arguments(r: argparse.ArgumentParser) -> None:
    """Replay one conversation turn by turn: build the prompt of each model call (after each
    user message and each complete run of tool results) with the builder that the same flags
    give `build`, and say how much of each prompt a provider's prefix cache could serve. The
    file holds {"messages": [...]} or a bare list of chat-completions messages, as one input
    line of `build`."""
    r.add_argument("conversation", metavar="CONVERSATION.json", help='a JSON file: {"messages": [...]} or a list')
    build = argparse.ArgumentParser(add_help=False)
    _add_build_arguments(build)
    for action in build._actions:  # the builder's flags, exactly as `build` defines them
        if action.dest not in _NOT_REPLAY:
            r._add_action(action)
    r.add_argument("--format", choices=("text", "json"), default="text",
                   help="stdout: one line (text, default: model-call turns, prefix hit rate, cached tokens) or "
                   "a JSON object of the totals and each turn")
    r.add_argument("--report", metavar="FILE.html",
                   help="also write a self-contained HTML page of the turns (needs jianmu_fast[report])")


def _replay(args: argparse.Namespace) -> int:
    from .errors import JianmuError
    from .replay import replay

    if args.report is not None:
        _check_report_path(args.report, ("CONVERSATION", args.conversation))
    try:
        counter = make_counter(args.tokenizer)
        builder = make_builder(args, counter)
    except (JianmuError, TypeError, ValueError) as exc:
        raise UsageError(f"{type(exc).__name__}: {exc}") from None
    tools = load_tools(args.tools_file) if args.tools_file is not None else None
    _tools_tokens(args, counter, tools)
    text = _read_text(args.conversation, "CONVERSATION")
    try:
        _, messages = _parse_line(text)
    except ValueError as exc:
        raise UsageError(f"CONVERSATION {args.conversation!r}: {_reason(exc)}") from None
    persona, rest = split_persona(messages)
    replaced = args.system_prompt is not None or args.system_prompt_file is not None
    try:
        result = replay(builder, rest, tools_schema=tools, counter=counter, offset=len(persona),
                        title=os.path.basename(args.conversation),
                        state=(lambda h: {"messages": h}) if replaced else (lambda h: {"messages": h, "persona": persona}))
    except Exception as exc:
        notes = "; ".join(getattr(exc, "__notes__", []))
        print(f"{PROG}: {args.conversation}: {_reason(exc)}{f' ({notes})' if notes else ''}", file=sys.stderr)
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
    "build": ("turn a JSONL file of conversations into a JSONL file of prompts", _add_build_arguments, _build),
    "replay": ("replay one conversation turn by turn: prompt sizes and prefix-cache hits", _add_replay_arguments,
               _replay),
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``jianmu-fast`` console script; returns the exit status."""
    parser = _parser()
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
