"""The command's options: the ``--tokenizer`` forms and their counter, the ``--tools-file``,
the parser class and the arguments of ``build`` and ``replay``."""

from __future__ import annotations

import argparse
import difflib
import json
import os
from typing import Any, Callable, NoReturn

from .common import UsageError, finite_float, read_text, reason_of, refuse_constant

__all__ = ["TOKENIZER_FORMS", "make_counter", "load_tools", "MAX_LIMIT", "MAX_WORKERS", "Parser",
           "add_build_arguments", "add_replay_arguments"]

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


def _template_only(spec: str, content_format: str) -> None:
    if content_format != "transformers":
        raise UsageError(
            f"--content-format {content_format}: --tokenizer {spec!r} has no chat template; the flag is for a "
            "model directory with one (tokenizer.json and tokenizer_config.json or chat_template.jinja)"
        )


def _tokenizer_error(spec: str, reason: str) -> UsageError:
    forms = "\n".join(f"  {form}: {what}" for form, what in TOKENIZER_FORMS)
    return UsageError(f"--tokenizer {spec!r}: {reason}\n--tokenizer accepts:\n{forms}")


def make_counter(spec: str, content_format: str = "transformers") -> Any:
    """The token counter for ``--tokenizer`` (the forms of ``TOKENIZER_FORMS``); a
    ``UsageError`` that lists every accepted form when ``spec`` is none of them.
    ``content_format`` (``--content-format``): how a model directory's chat template receives
    message contents -- as given ("transformers"), or as vLLM's server passes them ("string",
    "openai", "auto"; see ``ChatTemplateTokenCounter``); any other tokenizer counts text only
    and takes "transformers" alone.

    >>> make_counter("simple")
    SimpleTokenCounter(chars_per_token=4)
    >>> make_counter("gpt-4o")
    TiktokenTokenCounter('o200k_base')
    """
    from ..errors import JianmuError
    from ..memory.context import HFTokenCounter, SimpleTokenCounter, TiktokenTokenCounter

    try:
        if spec == "simple":
            _template_only(spec, content_format)
            return SimpleTokenCounter()
        if os.path.isdir(spec):
            from ..memory.context import ChatTemplateTokenCounter
            from ..memory.context.chat_template import has_chat_template

            if has_chat_template(spec):
                return ChatTemplateTokenCounter(spec, content_format=None if content_format == "transformers"
                                                else content_format)
            _template_only(spec, content_format)
            return HFTokenCounter(spec)
        _template_only(spec, content_format)
        if spec.endswith(".json") or os.sep in spec or os.path.exists(spec):
            if not os.path.isfile(spec):
                raise _tokenizer_error(spec, "no such tokenizer.json file")
            return HFTokenCounter(spec)
        return TiktokenTokenCounter(spec)
    except (JianmuError, ValueError, TypeError, OSError, ImportError) as exc:
        raise _tokenizer_error(spec, str(exc)) from None

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
    text = read_text(path, "--tools-file")
    try:
        tools = json.loads(text, parse_constant=refuse_constant, parse_float=finite_float)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{where}: {reason_of(exc)}") from None
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


class Parser(argparse.ArgumentParser):
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
                    out += Parser._all_options(sub)
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

def _tokenizer_help() -> str:
    return "; ".join(f"{form} ({what})" for form, what in TOKENIZER_FORMS)


def add_build_arguments(b: argparse.ArgumentParser) -> None:
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
    b.add_argument("--content-format", choices=("transformers", "string", "openai", "auto"), default="transformers",
                   help="with --tokenizer MODEL_DIR: how the chat template receives message contents: as given "
                        "(transformers, default), or as vLLM's OpenAI server passes them: content blocks' texts "
                        "joined by newlines (string), every content a list of text blocks (openai), or the one "
                        "vLLM detects for the template (auto)")
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

#: ``build``'s options that ``replay`` does not take (the rest, the builder's, it shares).
_NOT_REPLAY = frozenset({"help", "input", "output", "workers", "on_error", "format", "engine", "ray_address", "report"})


def add_replay_arguments(r: argparse.ArgumentParser) -> None:
    """Replay one conversation turn by turn: build the prompt of each model call (after each
    user message and each complete run of tool results) with the builder that the same flags
    give `build`, and say how much of each prompt a provider's prefix cache could serve. The
    file holds {"messages": [...]} or a bare list of chat-completions messages, as one input
    line of `build`."""
    r.add_argument("conversation", metavar="CONVERSATION.json", help='a JSON file: {"messages": [...]} or a list')
    build = argparse.ArgumentParser(add_help=False)
    add_build_arguments(build)
    for action in build._actions:  # the builder's flags, exactly as `build` defines them
        if action.dest not in _NOT_REPLAY:
            r._add_action(action)
    r.add_argument("--format", choices=("text", "json"), default="text",
                   help="stdout: one line (text, default: model-call turns, prefix hit rate, cached tokens) or "
                   "a JSON object of the totals and each turn")
    r.add_argument("--report", metavar="FILE.html",
                   help="also write a self-contained HTML page of the turns (needs jianmu_fast[report])")
