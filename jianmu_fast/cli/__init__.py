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

The package, one module per concept: ``options`` (flags, ``--tokenizer``, ``--tools-file``),
``builder`` (the preset and the input's persona), ``reading`` (lines in, parsed), ``processing``
(a chunk of lines built and rendered), ``writing`` (lines out), ``commands`` (``build``,
``replay``, ``main``), ``conversations`` (the command as a library), ``common``.
"""

from __future__ import annotations

from .builder import InputPersonaProvider, make_builder, split_persona
from .commands import main, make_parser, summarize
from .common import PROG, UsageError
from .conversations import ConversationResult, process_conversations, spec_namespace
from .options import MAX_LIMIT, MAX_WORKERS, TOKENIZER_FORMS, load_tools, make_counter

# the private names other code imported before the package split, kept importable
from .commands import make_parser as _parser  # noqa: E402
from .common import read_text as _read_text  # noqa: E402
from .processing import Job as _Job, process as _process  # noqa: E402
from .reading import CHUNK as _CHUNK, drop_nulls as _drop_nulls  # noqa: E402

__all__ = [
    "main", "make_counter", "make_builder", "load_tools", "InputPersonaProvider", "split_persona", "summarize",
    "spec_namespace", "process_conversations", "ConversationResult",
]
