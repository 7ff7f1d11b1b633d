"""``ChatTemplateTokenCounter``: exact prompt counts for open models, from their chat template.

What an open model served by transformers or vLLM sees is its Jinja chat template rendered over
the messages (and tools), tokenized. This counter renders the template the way transformers'
``apply_chat_template`` does (the same sandboxed Jinja environment: ``trim_blocks``,
``lstrip_blocks``, loop controls, transformers' ``tojson``, ``raise_exception``,
``strftime_now``; the tokenizer's ``bos_token``/``eos_token``/``unk_token``/``pad_token`` as
variables; the text tokenized with ``add_special_tokens=False``), without importing
transformers: it needs ``jinja2`` and ``tokenizers`` (``pip install 'jianmu_fast[hf]'``).
With fastokens installed (``pip install 'jianmu_fast[fast]'``) the default ``engine="auto"``
moves to fastokens once the counter has tokenized ``AUTO_FASTOKENS_CHARS`` characters (the
twin's load has paid for itself there; see ``HFTokenCounter``): the same ids (checked when the
twin is loaded, and by property tests on every bundled tokenizer) 10-150x faster.

The guarantee::

    count_messages(ms) + count_tools(tools, ms)
        == len(tokenizer.apply_chat_template(ms, tools=tools, add_generation_prompt=True,
                                             tokenize=True))

A ``Message`` reaches the template as transformers users and vLLM's OpenAI server pass it:
``None`` fields left out, tool-call ``arguments`` parsed from JSON into objects, ``content`` ""
for an assistant message that only calls tools, ``extra`` keys (``reasoning_content``...)
included, reasoning aliased to ``reasoning_content`` and ``thinking`` as transformers does.
Content blocks are passed as given, as transformers passes them; ``content_format`` gives
the content vLLM's server renders instead (block texts joined, or every content a list of
text blocks; see ``_content_format``).

**Segments.** A rendered template is not prefix-stable message by message, but it is (for the
templates we ship tests for) at unit boundaries: a unit is a non-tool message plus the tool
messages right after it, the same units the trimming filters keep or drop whole. The counter
renders each unit between small stand-in neighbours (a stand-in of the role before it; after
it, stand-ins ending on a user message, so no end-of-conversation effect falls on the unit) and
takes the difference in tokens; the end of the request (generation prompt, blocks the template
closes at the end) is calibrated once per last role. Unit counts are cached, and so are the
token counts of the text between the tokenizer's added tokens (encoded apart where that is
exact: no Metaspace/Prepend step, no whitespace-stripping added token), so a hot-loop turn
renders and tokenizes only its new units -- and most often does not even render them: a
conversation whose *frame* (everything but its real messages' ``content``, ``name`` and
``tool_call_id`` strings, their content blocks' texts and their tool calls' ids, function
names and arguments) was seen
before is assembled from the template's text around those fields, learned once with probes
that record what the template does with them (see ``_template_frames``: only where it prints
them verbatim or as ``tojson`` strings -- arguments as ``tojson`` with its default options --,
strips a field that has nothing to strip, and its truth tests and predicates give the same
answers; anything else renders). A unit whose count does not depend on its
neighbours (probed once per role pattern with stand-ins) is rendered with the smallest
context, shared by every place it appears. The cost of a unit is spread over its messages by
prefixes (message ``j`` costs ``tokens(unit[:j+1]) - tokens(unit[:j])``), so counts of earlier
messages never change when tool results are appended.

A template that closes a block in the *next* message's rendering (DeepSeek-V3 prints the end of
a tool-output block in the assistant turn after the results, and nothing before a user
message) fails that self-check: each unit, costed before its real successor, would carry the
closing text, and so would the successor. Such a template is checked again with every unit
costed before a user stand-in whatever follows it (``_succ_blind``): the closing text then
falls on the successor alone, costed after its real predecessor. A template that renders a
unit by whether a *final answer* (a plain assistant message) follows it anywhere later
(gpt-oss shows a tool call's text as analysis only while none follows) is checked with each
unit costed before stand-ins of its successor and, where the conversation has a final answer
after it, of one (``_final_rule``; a final answer arriving in a turn changes what the
earlier calls with text cost, so that turn costs its units again instead of reusing them).
A template that prints an assistant message's text right after the system prompt's, with
nothing between (DeepSeek-V3: a trimmed prompt whose cut falls before an answer or a call;
the two texts may merge into one token where the system prompt ends in whitespace), is
checked with the real system message standing before a unit that follows one
(``_real_system_pred``). A template that prints an assistant message's reasoning (and reads
``</think>`` in its text as reasoning) only after the last user query (Qwen3: stripped before
it) is checked with each unit that holds such reasoning after the last user message costed
before stand-ins of its successor and then a call and its result -- no user message after it
(``_query_rule``; a new user message strips the previous ones, which cost again, as does a cut
that drops the last user message). Under ``_final_rule``, an assistant's reasoning that adds up
costed as a call's text is (gpt-oss) is counted from segments too (``_final_reasoning``).

**When it falls back to full rendering** (``count_messages``, decided per call): when the
template failed the additivity self-check run at construction (a few probe conversations whose
segment sums must equal their full rendering; in both forms above), when a message carries
reasoning (``reasoning_content``/``thinking``/``reasoning``) that the template reads by a rule
the probes at construction did not confirm (a template that prints none of it counts such
messages from segments; so do Qwen3 under ``_query_rule`` -- but where the last user message
is no query to it, a content block list or a ``<tool_response>`` text, and the conversation
holds reasoning -- and gpt-oss under ``_final_reasoning``: a call's reasoning is shown while no
final answer follows, costed as its text is; an answer's never), when a
message carries text the template was found (by more probes at construction) to render by
what follows it in a way none of the rules above covers, when a
system message follows the first and the probes found the template to join their texts
(DeepSeek-V3: a later system message's first tokens depend on where the text before it ends),
when a tool result follows a message other than its call's unit (hostile order) and the
probes found the template to render it by what came before (DeepSeek-V3, gpt-oss), or when
the conversation does not end on a user or tool message (Qwen3 renders a final assistant
message differently). Everything else -- the agent-loop calls, which end on a user or tool
message -- is counted from cached segments, exactly.

``count_messages([])`` is the largest fixed cost a request can have (the template's text around
the messages and its generation prompt, and what it adds at the end: Qwen3 gives a final
assistant message an empty think block), so ``count_messages([]) + sum(count_array(ms))``
equals ``count_messages(ms)`` when that end cost is the same for every last role (all tested
templates but Qwen3, where it is up to 4 tokens above for calls ending on a user or tool
message), and is never below it.

**Per-message counts** (``count_message``, ``count_array``; what ``TokenBudgetFilter`` sums):
a unit whose rendering depends on its neighbours (probed once per role pattern with stand-in
messages: DeepSeek's assistant turn after tool results closes their block, Llama 3.1 folds a
leading system message into its header) is charged the most it costs over every neighbour it
could have in a kept prompt -- after it, any successor; before it, the message before it or what
trimming may put there instead (nothing, the pinned system prompt) -- (a unit with reasoning, or
with text the template looks ahead for: kept or stripped, whichever costs more), so a unit is
charged the same in a turn's new messages (counted knowing the message before them:
``count_list``'s ``pred``) as in a whole conversation, and
``count_messages([]) + sum(count_array(kept))`` is never below the exact count of the kept
prompt, and equal to it (but for the end cost above) for neighbour-independent units (every
unit of the Qwen3, Hermes/Qwen2.5, Llama 3.1, Mistral and gpt-oss templates without
reasoning, and without text beside a gpt-oss call: charged as shown). ``count_array(ms)`` takes a ``system`` message at ``ms[0]`` to start the
conversation (the pinned prefix, first in every kept prompt); ``TokenBudgetFilter`` counts a
turn's new messages, and any slice past the first message, as following others (a system
message opening them is charged the most it costs after any neighbour: Llama 3.1 charges a
later system message 5 tokens more than the first). A slice that starts with a tool message
gets the assistant message that made its call (remembered by call id) as neighbour, or a
stand-in when the counter never saw it; ``TokenBudgetFilter`` counts a slice from the start of
the unit its first message is in (a result costs what it adds to its call and the results
before it, as in the whole conversation).

**Tools** go where the template puts them (a system block, the first or last user message):
their marginal cost, ``count_tools(tools, messages)``, is the exact count of the request with
them minus ``count_messages(messages)`` (one full rendering, cached). Only the sum with
``count_messages`` is guaranteed exact.

A template that refuses a conversation (``raise_exception``: parallel calls on Llama 3.1, a
tool result without a ``name`` on Hermes) raises :class:`~jianmu_fast.errors.MessageValidationError`
carrying the template's message; no count is made up.
"""

from __future__ import annotations

import collections
import copy
import gzip
import json
import os
import threading
import weakref
from bisect import bisect_right as _bisect_right
from datetime import datetime
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

from ...errors import MessageValidationError, TokenizerLoadError
from ...message import Message
from ... import _backend
from ..._template_core_py import _REASONING_FIELDS, _has_reasoning, _text_features
from . import _encodings
from ._template_frames import Frames
from ._content_format import check_content_format, content_format_of, openai_content, string_content
from ..._template_base import NOT_YET
from ..._template_base import Refused as _Refused
from ._template_frames import remember_json as _remember_json
from ._template_frames import tojson as _frames_tojson

#: the hot path (``jianmu_fast._template_core``, compiled, or its twin ``_template_core_py``):
#: ChatTemplateTokenCounter's per-message and per-unit methods, bound below
_tc = _backend.template_core()
message_to_template_dict = _tc.message_to_template_dict
_message_key = _tc.message_key  # (the tests name them here)
_parse_key = _tc.parse_key
_call_entry = _tc.call_entry

__all__ = ["ChatTemplateTokenCounter", "has_chat_template", "message_to_template_dict"]

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
#: the top-level string fields a frame leaves out (see _template_frames): an assistant's
#: reasoning too, where the template reads it (Qwen3 prints it stripped after the last query)
_FRAME_FIELDS = ("content", "name", "tool_call_id") + _REASONING_FIELDS

# Stand-in neighbours. Distinct contents, so templates comparing messages (Mistral's
# ``message == user_messages[-1]``) never confuse two of them.
_S_SYS = {"role": "system", "content": "."}
_S_USER = {"role": "user", "content": "."}
_S_ASST = {"role": "assistant", "content": "."}
_S_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "f", "arguments": {}}}],
}
_S_TOOL = {"role": "tool", "content": ".", "tool_call_id": "call_0", "name": "f"}
_S_USER2 = {"role": "user", "content": ","}
_S_ASST2 = {"role": "assistant", "content": ","}
_S_SYS2 = {"role": "system", "content": ","}
_S_USER3 = {"role": "user", "content": ";"}
#: a system stand-in whose text ends on a letter (see _PRE["system_text"])
_S_SYS_TEXT = {"role": "system", "content": "x"}

#: what stands before a unit, by the role of the message before it
_PRE: dict[str, list[dict[str, Any]]] = {
    "first": [],
    "system": [_S_SYS],
    "user": [_S_SYS, _S_USER],
    "assistant": [_S_SYS, _S_USER, _S_ASST],
    "call": [_S_SYS, _S_USER, _S_CALL],
    "tool": [_S_SYS, _S_USER, _S_CALL, _S_TOOL],
    # (a system unit's, beside the above: a template that joins the system messages' texts
    # (DeepSeek-V3's header, "\n\n" between them) puts a later one's text right after the
    # previous one's, where "." takes the "\n\n" into its pre-token and a letter does not: 1
    # token under, and the most over both is the bound)
    "system_text": [_S_SYS_TEXT, _S_USER],
}
#: what stands after a unit, by the role of the message after it ("end": nothing). Each ends
#: on a user message, so that what templates do to a final message (Qwen3's empty think block
#: after the last user query) never falls on a stand-in.
_POST: dict[str, list[dict[str, Any]]] = {
    "end": [],
    "user": [_S_USER2],
    "assistant": [_S_ASST2, _S_USER3],
    "system": [_S_SYS2, _S_USER3],
    # a template that looks ahead for a later final answer (see ChatTemplateTokenCounter._final_rule):
    # the successor, then whether a plain assistant message follows somewhere
    "user_final": [_S_USER2, _S_ASST2, _S_USER3],
    "system_final": [_S_SYS2, _S_ASST2, _S_USER3],
    "call": [_S_CALL, _S_TOOL, _S_USER3],
    "call_final": [_S_CALL, _S_TOOL, _S_ASST2, _S_USER3],
    # a unit after the last user message whose reasoning the template prints there (see
    # ChatTemplateTokenCounter._query_rule): its successor, then no user message -- a call and
    # its result, so the unit is not the last message either (the last unit is costed as if an
    # assistant message followed it)
    "assistant_kept": [_S_ASST2, _S_CALL, _S_TOOL],
    "system_kept": [_S_SYS2, _S_CALL, _S_TOOL],
}
#: what stands before such a unit after a system message (a user message before both)
_PRE_SYSTEM_KEPT = (json.dumps(_S_SYS), json.dumps(_S_USER), json.dumps(_S_SYS2))

_PRE_KEYS = {k: tuple(json.dumps(d) for d in v) for k, v in _PRE.items()}
_POST_KEYS = {k: tuple(json.dumps(d) for d in v) for k, v in _POST.items()}
_STANDIN_DICTS = {json.dumps(d): d for v in (*_PRE.values(), *_POST.values()) for d in v}

#: attributes of a plain dict (anything else the sandbox looks up as a key)
_DICT_ATTRS = frozenset(dir(dict))
#: str methods the sandbox lets templates read as they are (public, not str.format/format_map,
#: which it wraps)
_SAFE_STR_METHODS = frozenset(
    a for a in dir(str) if not a.startswith("_") and a not in ("format", "format_map")
)
_BUILTIN_METHOD = type("".strip)
#: a single new piece shorter than this is encoded with ``encode`` (no batch handoff); a longer
#: one goes through ``encode_batch_fast`` all the same, which skips the offsets ``encode``
#: computes (about 25 % faster on a 1-4 kB tool result)
_SHORT = 256


_CALL1 = [{"id": "p1", "type": "function", "function": {"name": "get", "arguments": '{"q": "a b"}'}}]
_CALL2 = _CALL1 + [{"id": "p2", "type": "function", "function": {"name": "put", "arguments": '{"n": 2}'}}]
def _probe_messages(probe: Sequence[tuple[Any, ...]]) -> list[Message]:
    """The messages of a probe conversation (``_PROBES``' items: ``(role, text)``, ``("call",
    calls[, text])``, ``("tool", call id, text)``; a result of ``p1`` names ``get``, any other
    ``put``; ``("think", text, reasoning)`` and ``("think_call", calls, text, reasoning)``: an
    answer and a call with ``reasoning_content``)."""
    ms = []
    for item in probe:
        if item[0] == "think":
            ms.append(Message(role="assistant", content=item[1], extra={"reasoning_content": item[2]}))
        elif item[0] == "think_call":
            ms.append(Message(role="assistant", content=item[2], tool_calls=item[1],
                              extra={"reasoning_content": item[3]}))
        elif item[0] == "call":
            ms.append(Message(role="assistant", content=item[2] if len(item) > 2 else None, tool_calls=item[1]))
        elif item[0] == "tool":
            name = "get" if item[1] == "p1" else "put"
            ms.append(Message(role="tool", content=item[2], tool_call_id=item[1], name=name))
        else:
            ms.append(Message(role=item[0], content=item[1]))
    return ms


#: the conversations ``_reads_reasoning`` renders with reasoning on their assistant messages and
#: without (answers and calls before and after the last user message, a last answer, a last call)
_REASONING_PROBES: list[list[tuple[Any, ...]]] = [
    [("user", "one"), ("assistant", "two"), ("user", "three"), ("assistant", "four")],
    [("system", "sys"), ("user", "find a"), ("call", _CALL1), ("tool", "p1", "result one"), ("assistant", "done"),
     ("user", "and b"), ("call", _CALL1, "Checking."), ("tool", "p1", "result two")],
    [("user", "go"), ("call", _CALL1, "Let me check."), ("tool", "p1", "r"), ("call", _CALL1)],
]
#: the additivity self-check's probe conversations: (role, text), ("call", calls[, text]),
#: ("tool", call id, text)
_PROBES: list[list[tuple[Any, ...]]] = [
    [("system", "Be brief."), ("user", "Hello there"), ("assistant", "Hi! How can I help?"), ("user", "What is 2+2?")],
    [("user", "one"), ("assistant", "two"), ("user", "three")],
    [("system", "sys"), ("user", "find a"), ("call", _CALL1), ("tool", "p1", "result one"), ("assistant", "done"),
     ("user", "again")],
    [("user", "go"), ("call", _CALL1), ("tool", "p1", "r")],
    [("system", "s"), ("user", "two calls"), ("call", _CALL2), ("tool", "p1", "r1"), ("tool", "p2", "r2"),
     ("assistant", "ok"), ("user", "q")],
]
#: probes for reasoning printed only after the last user message (see
#: ChatTemplateTokenCounter._query_check): units with it after the last user message, followed
#: by calls, answers, a system message or nothing, after each neighbour; before it; ``</think>``
#: text in an answer and a call, before and after
_QUERY_PROBES: list[list[tuple[Any, ...]]] = [
    [("user", "go"), ("think_call", _CALL1, None, "Let me look."), ("tool", "p1", "r"),
     ("think_call", _CALL1, "Checking.", "\nStill looking.\n"), ("tool", "p1", "r2")],
    [("system", "sys"), ("user", "find a"), ("think_call", _CALL1, None, "Find it."), ("tool", "p1", "result one"),
     ("think", "done", "It is found."), ("user", "and b"), ("think_call", _CALL2, None, "Both."),
     ("tool", "p1", "r1"), ("tool", "p2", "r2")],
    [("user", "a"), ("think_call", _CALL1, "Checking.", "hm"), ("tool", "p1", "r"), ("think", "Here.", "ok then"),
     ("call", _CALL1), ("tool", "p1", "r2"), ("think_call", _CALL1, None, "again"), ("tool", "p1", "r3")],
    [("user", "a"), ("think", "x", "thought"), ("user", "b")],
    [("system", "s"), ("user", "a"), ("think_call", _CALL1, None, "r"), ("tool", "p1", "r"), ("system", "note"),
     ("think_call", _CALL1, None, "after the note"), ("tool", "p1", "r2")],
    [("user", "a"), ("assistant", "<think>\nhm\n</think>\n\nok"), ("user", "b"),
     ("call", _CALL1, "<think>\nx\n</think>\n\nsure"), ("tool", "p1", "r"), ("assistant", "<think>\ny\n</think>\n\nfine"),
     ("call", _CALL1), ("tool", "p1", "r2")],
    [("think", "first", "no user yet"), ("user", "a"), ("call", _CALL1), ("tool", "p1", "r"),
     ("think_call", _CALL1, "", "plain"), ("tool", "p1", "r2")],
]
#: probes for reasoning under the final-answer rule (see ChatTemplateTokenCounter._final_reasoning_check):
#: calls with reasoning before and after final answers, answers with it, a system message
#: between, a call's text beside empty reasoning (gpt-oss refuses text beside reasoning)
_FINAL_REASONING_PROBES: list[list[tuple[Any, ...]]] = [
    [("user", "go"), ("think_call", _CALL1, None, "Let me look."), ("tool", "p1", "r"),
     ("think_call", _CALL1, None, "\nAgain.\n"), ("tool", "p1", "r2")],
    [("system", "sys"), ("user", "find a"), ("think_call", _CALL1, None, "Find it."), ("tool", "p1", "one"),
     ("think", "done", "It is found."), ("user", "and b"), ("think_call", _CALL1, None, "Now b."), ("tool", "p1", "two")],
    [("user", "a"), ("think_call", _CALL1, "Checking.", ""), ("tool", "p1", "r"), ("think", "ok", "z"), ("user", "b")],
    [("user", "a"), ("think_call", _CALL1, None, "r"), ("tool", "p1", "r"), ("system", "note"), ("think", "done", "z"),
     ("user", "b"), ("think_call", _CALL1, None, "q"), ("tool", "p1", "r2")],
    [("user", "a"), ("think", "x", "thought"), ("user", "b"), ("think_call", _CALL1, None, "r"), ("tool", "p1", "r")],
]
#: probes for text features that a template may render by what follows (see _text_features)
_FEATURE_PROBES: dict[str, list[list[tuple[Any, ...]]]] = {
    "call_text": [
        [("user", "go"), ("call", _CALL1, "Let me check."), ("tool", "p1", "r"), ("user", "more"),
         ("call", _CALL1, "Looking."), ("tool", "p1", "r2"), ("assistant", "done"), ("user", "q")],
        [("system", "s"), ("user", "go"), ("call", _CALL1, "Checking."), ("tool", "p1", "r")],
        [("user", "a"), ("call", _CALL1, "Checking."), ("tool", "p1", "r"), ("call", _CALL1, "Again."),
         ("tool", "p1", "r2")],
    ],
    # a system message after the first (DeepSeek-V3 joins every system message's text into its
    # header: a later one's first tokens depend on where the text before it ends)
    "later_system": [
        [("system", "Paris"), ("system", "Paris"), ("user", "x")],
        [("system", "A"), ("user", "a"), ("system", "B."), ("user", "b"), ("assistant", "c"), ("system", "D"),
         ("user", "e")],
        [("user", "a"), ("system", "Now"), ("user", "b")],
    ],
    # an assistant message right after a system message (a trimmed prompt's cut before an answer
    # or a call): DeepSeek-V3 prints both texts with no token between, so they may merge
    "after_system": [
        [("system", "  padded  "), ("assistant", "Paris"), ("user", "x")],
        [("user", "a"), ("system", "Be brief"), ("assistant", "ok"), ("user", "b")],
        [("system", "  padded  "), ("assistant", ""), ("user", "x")],
    ],
    # (and a call, with text or without)
    "call_after_system": [
        [("system", "Be brief"), ("call", _CALL1, "Let me check."), ("tool", "p1", "r"), ("user", "x")],
        [("system", "  padded\n"), ("call", _CALL1, "Let me check."), ("tool", "p1", "r"), ("user", "x")],
        [("system", "  padded  "), ("call", _CALL1), ("tool", "p1", "r"), ("user", "x")],
    ],
    # a tool result whose unit does not open with the call (hostile order): DeepSeek-V3 prints a
    # result as the block's first by whether any result stood since the last call, gpt-oss names
    # it after the last call made, however far back
    "orphan_tool": [
        [("user", "go"), ("call", _CALL1), ("tool", "p1", "r"), ("assistant", "ok"), ("user", "more"),
         ("tool", "p1", "r2"), ("user", "q")],
        [("user", "go"), ("call", _CALL1), ("tool", "p1", "r"), ("user", "more"), ("tool", "p1", "r2")],
    ],
    "think_text": [
        [("user", "a"), ("assistant", "<think>\nhm\n</think>\n\nok"), ("user", "b")],
        [("user", "a"), ("assistant", "<think>\nhm\n</think>\n\nsure"), ("call", _CALL1), ("tool", "p1", "r")],
        [("user", "a"), ("call", _CALL1, "<think>\nhm\n</think>\n\nsure"), ("tool", "p1", "r")],
    ],
}

#: probes for call text under the final-answer rule (a final answer later in the conversation,
#: after a user message, a call, or none; see ChatTemplateTokenCounter._final_check)
_FINAL_PROBES: list[list[tuple[Any, ...]]] = [
    [("user", "go"), ("call", _CALL1, "Let me check."), ("tool", "p1", "r"), ("call", _CALL1, "Then."),
     ("tool", "p1", "r2"), ("assistant", "done"), ("user", "more"), ("call", _CALL1, "Again."),
     ("tool", "p1", "r3")],
    [("system", "s"), ("user", "go"), ("call", _CALL1, "Checking."), ("tool", "p1", "r"), ("system", "t"),
     ("assistant", "done"), ("user", "q"), ("call", _CALL1, "Now."), ("tool", "p1", "r2"), ("user", "u")],
    [("user", "a"), ("call", _CALL1, "Checking."), ("tool", "p1", "r"), ("user", "b"), ("call", _CALL1),
     ("tool", "p1", "r2"), ("assistant", "ok"), ("user", "c")],
]


def _compile(template: str) -> Any:
    """The template compiled in an environment like transformers' ``_compile_jinja_template``."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:  # pragma: no cover - the [hf] extra installs it
        raise ImportError(
            "ChatTemplateTokenCounter needs jinja2: pip install 'jianmu_fast[hf]'"
        ) from exc

    class _Generation(jinja2.ext.Extension):
        # transformers' AssistantTracker: {% generation %}...{% endgeneration %} renders its body
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}."
                )

    class _Env(ImmutableSandboxedEnvironment):
        # The immutable sandbox's verdict on an attribute depends only on the object's type and
        # the name (jinja2.sandbox: the leading underscore, is_internal_attribute and
        # modifies_known_mutable are isinstance checks and name sets; the value is not read),
        # so it is cached per (type, name): the same verdicts, without the ABC checks each time.
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._verdicts: dict[tuple[type, str], bool] = {}

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            key = (type(obj), attr)
            verdict = self._verdicts.get(key)
            if verdict is None:
                verdict = self._verdicts[key] = super().is_safe_attribute(obj, attr, value)
            return verdict

        # Fast paths with the sandbox's own outcomes. ``m.role`` on a plain dict: the sandbox
        # tries the attribute, which a dict has only for the names in dir(dict), then the key.
        def getattr(self, obj: Any, attribute: str) -> Any:
            t = type(obj)
            if t is dict and attribute not in _DICT_ATTRS:
                try:
                    return obj[attribute]
                except (TypeError, LookupError):
                    return self.undefined(obj=obj, name=attribute)
            if t is str and attribute in _SAFE_STR_METHODS:  # not format/format_map: no wrapping
                return getattr(obj, attribute)
            return super().getattr(obj, attribute)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            # a builtin method has no attributes of its own: never ``unsafe_callable`` or
            # ``alters_data``, so the sandbox's check always passes
            if type(__obj) is _BUILTIN_METHOD:
                return __context.call(__obj, *args, **kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    env = _Env(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _frames_tojson  # transformers' (a frame's probes may pass through it)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)


def _as_blocks(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` as an "openai" content format template receives it: a string content (a probe
    too: its length read as ``str``'s, unrecorded) as one text block, "" and no content as
    ``[]`` (an explicit "" became its block earlier, in ``_formatted``)."""
    c = d.get("content")
    if isinstance(c, list):
        return d
    if isinstance(c, str) and str.__len__(c):
        return {**d, "content": [{"type": "text", "text": c}]}
    return {**d, "content": []}


def _token_text(value: Any) -> Optional[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def has_chat_template(path: Any) -> bool:
    """Whether the model folder ``path`` holds a chat template (``chat_template.jinja``, or a
    ``chat_template`` in ``tokenizer_config.json``).

    >>> has_chat_template("/nonexistent")
    False
    """
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, "chat_template.jinja")) or _extra_templates(path):
        return True
    try:
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            return bool(json.load(f).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


#: where transformers finds a model folder's named chat templates besides ``chat_template.jinja``
_EXTRA_TEMPLATES_DIR = "additional_chat_templates"


def _extra_templates(path: str) -> dict[str, str]:
    """``{name: path}`` of the ``additional_chat_templates/*.jinja`` files of a model folder."""
    folder = os.path.join(path, _EXTRA_TEMPLATES_DIR)
    if not os.path.isdir(folder):
        return {}
    return {f[:-len(".jinja")]: os.path.join(folder, f) for f in sorted(os.listdir(folder))
            if f.endswith(".jinja") and os.path.isfile(os.path.join(folder, f))}


def _named_templates(path: str, config: Mapping[str, Any]) -> dict[str, str]:
    """A model folder's chat templates by name, as transformers loads them: the template
    files (``chat_template.jinja`` as ``"default"``, ``additional_chat_templates/NAME.jinja``)
    where there are any, else the ``chat_template`` of ``tokenizer_config.json`` (a string:
    ``"default"``; a list of ``{"name", "template"}``: each by its name)."""
    files = dict(_extra_templates(path))
    jinja_path = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja_path):  # transformers 5 prefers the template files
        files["default"] = jinja_path
    if files:
        out = {}
        for name, file in files.items():
            with open(file, encoding="utf-8") as f:
                out[name] = f.read()
        return out
    return _templates_of(config.get("chat_template"))


def _templates_of(value: Any) -> dict[str, str]:
    """``{name: template}`` of a ``chat_template`` value: a string (``"default"``), a dict of
    named templates, or the list of ``{"name": ..., "template": ...}`` that tokenizer configs hold.

    >>> _templates_of([{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}])
    {'default': 'A', 'tool_use': 'B'}
    """
    if isinstance(value, str):
        return {"default": value} if value else {}
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = [(t.get("name"), t.get("template")) for t in value if isinstance(t, Mapping)]
    else:
        return {}
    return {k: v for k, v in items if isinstance(k, str) and isinstance(v, str) and v}


def _load_dir(path: str) -> tuple[Any, dict[str, str], dict[str, str], Optional[str]]:
    from tokenizers import Tokenizer

    tok_path = os.path.join(path, "tokenizer.json")
    digest: Optional[str] = None
    try:
        if os.path.isfile(tok_path):  # one tokenizer per file content and process, as HFTokenCounter's
            from ._encodings import load_hf_tokenizer

            tok, _, digest = load_hf_tokenizer(tok_path)
        elif os.path.isfile(tok_path + ".gz"):
            with gzip.open(tok_path + ".gz", "rt", encoding="utf-8") as f:
                tok = Tokenizer.from_str(f.read())
        else:
            raise TokenizerLoadError(f"{path!r}: no tokenizer.json in this model directory")
    except TokenizerLoadError:
        raise
    except Exception as exc:
        raise TokenizerLoadError(f"{tok_path!r}: cannot load the tokenizer: {exc}") from exc
    config: dict[str, Any] = {}
    cfg_path = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(cfg_path):
        try:
            with open(cfg_path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as exc:
            raise TokenizerLoadError(f"{cfg_path!r}: cannot read it as JSON: {exc}") from exc
    try:
        templates = _named_templates(path, config)
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerLoadError(f"{path!r}: cannot read its chat template: {exc}") from exc
    if not templates:
        raise TokenizerLoadError(
            f"{path!r}: no chat template (looked for chat_template.jinja, {_EXTRA_TEMPLATES_DIR}/*.jinja and "
            "a 'chat_template' in tokenizer_config.json)"
        )
    special = {k: t for k in _SPECIAL_KEYS if (t := _token_text(config.get(k))) is not None}
    return tok, templates, special, digest



#: ``Frames`` tables shared per (tokenizer sha256, template, special tokens, template
#: variables) in a process (a frame's text is the template's alone)
_FRAME_TABLES: dict[tuple[Any, ...], dict[Any, Any]] = {}
#: unit plans (see ``ChatTemplateTokenCounter._plan``), shared as the frame tables are
_PLAN_TABLES: dict[tuple[Any, ...], dict[Any, Any]] = {}
#: the value runs of those plans, one object per distinct run (``_build_plan``), shared with them
_RUN_TABLES: dict[tuple[Any, ...], dict[Any, Any]] = {}
#: tool lists' probed signature parts (``_tools_parts``) and their marginal costs by prompt
#: signature (``count_tools``), shared as the frame tables are
_TOOLS_TABLES: dict[tuple[Any, ...], tuple[dict[Any, Any], dict[Any, Any]]] = {}
_TABLES_LOCK = threading.Lock()


class ChatTemplateTokenCounter(_tc.CounterCore):  # type: ignore[misc,name-defined]
    """Exact token counts of a request to an open model, from its tokenizer and chat template.

    ``path_or_tokenizer`` is a local model directory (``tokenizer.json`` and
    ``tokenizer_config.json`` with a ``chat_template``, or a ``chat_template.jinja``), or a
    ``tokenizers.Tokenizer`` (then ``chat_template`` is required). A model's named templates
    are read as transformers reads them (a list of ``{"name", "template"}`` in the config, or
    ``additional_chat_templates/NAME.jinja``): requests count by "default", and those with
    tools by "tool_use" where the model names one (see ``count_tools``);
    ``chat_template="NAME"`` picks one for every request. ``special_tokens`` overrides
    or sets ``bos_token``, ``eos_token``, ... and ``template_kwargs`` adds template variables
    (``date_string``, ``reasoning_effort``...), as ``apply_chat_template(**kwargs)`` would.
    ``content_format``: how message contents reach the template -- as given (None, as
    transformers passes them), or as vLLM's OpenAI server normalizes them: ``"string"``,
    ``"openai"``, or ``"auto"`` (the template's own, detected as vLLM detects it); see
    ``_content_format``. ``ValueError`` for any other value.

    See the module docstring for what is exact and when it falls back to full rendering.

    ``engine`` picks what tokenizes renderings, as ``HFTokenCounter``'s: ``"tokenizers"``,
    ``"fastokens"`` (``pip install 'jianmu_fast[fast]'``; ``ValueError`` if fastokens cannot
    load the tokenizer or fails the load-time check of equal ids) or ``"auto"`` (default:
    tokenizers until the counter has tokenized ``AUTO_FASTOKENS_CHARS`` characters, then
    fastokens when installed and checked, else tokenizers). Counts are the same either way.

    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    >>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
    >>> tpl = "{% for m in messages %}<{{ m.role }}> {{ m.content }}\\n{% endfor %}"
    >>> tpl += "{% if add_generation_prompt %}<assistant>{% endif %}"
    >>> c = ChatTemplateTokenCounter(tok, tpl)
    >>> from jianmu_fast.message import human
    >>> c.count_messages([]), c.count_message(human("hi there")), c.count_messages([human("hi there")])
    (3, 5, 8)
    """

    cache_size: int
    #: new units' renderings between stand-ins are assembled from cached frames where the
    #: template prints the messages' fields verbatim (see ``_template_frames``)
    _RENDER_FREE = True
    #: ``engine="auto"`` moves to fastokens once the counter has tokenized this many characters
    #: (renderings' pieces not cached yet), as ``HFTokenCounter.AUTO_FASTOKENS_CHARS``
    AUTO_FASTOKENS_CHARS = 5_000_000
    #: the message keys (a message's template dict printed) the caches hold, in characters,
    #: before the oldest quarter of what is cached by key is dropped (``_tc.shed_keys``): an
    #: eval run's finished conversations are not kept until ``cache_size`` entries (~25 MB at
    #: the bound on a customer-service trace, where 65,536 entries were ~100 MB); a coding
    #: agent's conversation of 150 messages and 30k tokens holds ~0.15 M of them
    MAX_KEY_CHARS = 1 << 23

    def __init__(
        self,
        path_or_tokenizer: Any,
        chat_template: Optional[str] = None,
        *,
        special_tokens: Optional[Mapping[str, str]] = None,
        template_kwargs: Optional[Mapping[str, Any]] = None,
        cache_size: int = 1 << 16,
        engine: str = "auto",
        content_format: Optional[str] = None,
    ) -> None:
        _encodings.check_hf_engine(engine)
        check_content_format(content_format)
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover
            raise ImportError("ChatTemplateTokenCounter needs tokenizers: pip install 'jianmu_fast[hf]'") from exc
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"cache_size must be a positive int, got {cache_size!r}")
        self.cache_size = cache_size
        self.path: Optional[str] = None
        special: dict[str, str] = {}
        digest: Optional[str] = None
        if isinstance(path_or_tokenizer, (str, os.PathLike)):
            path = os.fspath(path_or_tokenizer)
            if not os.path.isdir(path):
                raise TokenizerLoadError(
                    f"{path!r}: not a model directory (expected a folder with tokenizer.json and "
                    "tokenizer_config.json or chat_template.jinja)"
                )
            tok, templates, special, digest = _load_dir(path)
            self.path = path
        elif isinstance(path_or_tokenizer, Tokenizer):
            tok, templates = path_or_tokenizer, {}
        elif isinstance(getattr(path_or_tokenizer, "backend_tokenizer", None), Tokenizer):
            tok = path_or_tokenizer.backend_tokenizer
            templates = _templates_of(getattr(path_or_tokenizer, "chat_template", None))
            for k in _SPECIAL_KEYS:
                v = getattr(path_or_tokenizer, k, None)
                if isinstance(v, str):
                    special[k] = v
        else:
            raise TypeError(
                "path_or_tokenizer: expected a model directory, a tokenizers.Tokenizer or a transformers "
                f"fast tokenizer, got {type(path_or_tokenizer).__name__}"
            )
        #: the template transformers renders a request *with tools* by, where the model names a
        #: "tool_use" template besides its default (Hermes 2 Pro, Command R): see count_tools
        self._tool_use_template: Optional[str] = None
        self._tool_counter: Optional[ChatTemplateTokenCounter] = None
        self._chat_template_arg = chat_template
        if chat_template is not None:
            if not isinstance(chat_template, str) or not chat_template:
                raise TypeError(f"chat_template must be a non-empty string, got {chat_template!r}")
            # a template, or the name of one of the model's (as apply_chat_template(chat_template=...))
            template: Any = templates.get(chat_template, chat_template)
        elif not templates:
            raise ValueError("chat_template is required with a tokenizers.Tokenizer (the Jinja template string)")
        elif "default" not in templates:
            raise TokenizerLoadError(
                f"{self.path or 'the tokenizer'!r}: named chat templates {sorted(templates)} without a 'default' "
                "one; pass chat_template=<name> (as transformers asks for)"
            )
        else:
            template = templates["default"]
            if templates.get("tool_use", template) != template:
                self._tool_use_template = templates["tool_use"]
        if self.path is None:  # a private copy of the caller's tokenizer: truncation and padding off
            tok = Tokenizer.from_str(tok.to_str())
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        self._encode_batch = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
        self.engine: str = engine
        # the fastokens twin of _tok (None: tokenizers); see the class docstring
        self._fast: Any = None
        self._digest = digest
        self._auto_chars = 0 if engine == "auto" else -1  # -1: engine decided
        if engine == "fastokens":
            self._fast = _encodings.hf_fastokens(tok, engine, digest, "ChatTemplateTokenCounter")
        self.chat_template: str = template
        if special_tokens:
            special.update(special_tokens)
        self.special_tokens: dict[str, str] = special
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        self._template = _compile(template)
        self._content_format_arg = content_format
        #: how a message's content reaches the template: None as given (transformers), else
        #: vLLM's "string" or "openai" ("auto": the template's, see _content_format)
        self.content_format: Optional[str] = (
            content_format_of(template) if content_format == "auto" else content_format)
        self._content_format: Optional[str] = self.content_format  # (read by the compiled entry)
        self._lock = threading.Lock()
        self._pieces: dict[str, int] = {}  # text between added tokens -> tokens
        self._long_pieces: dict[Any, Any] = {}  # the same, for the last long ones (see _tc.piece_counts)
        self._run_texts: dict[Any, Any] = {}  # the last value runs holding a long value (_tc.run_text)
        # tools (their JSON) -> whether the template prints them again for a repeated user
        # message (tools_surplus); a function of the template and the tools only
        self._tools_repeat: dict[str, bool] = {}
        # the last tool list count_tools/count_request saw (a deep copy) and its (JSON, tools)
        self._tools_seen: Optional[tuple[Any, tuple[str, list[Any]], Any, Optional[list]]] = None  # (the list itself, its snapshot)
        # tools JSON -> the signature parts their cost depends on (None: rendered whole), and
        # (tools JSON, prompt signature) -> marginal cost: see count_tools
        self._tools_parts_of: dict[str, Optional[tuple[bool, bool, bool, bool]]] = {}
        self._marginals: dict[tuple[Any, ...], int] = {}
        self._split = self._piecewise_splitter()
        # frames: conversations assembled around their messages' verbatim fields, not rendered
        # (see _template_frames); message key -> (frame part, field values)
        self._frames = Frames(self._render_plain, _FRAME_FIELDS, cache_size=cache_size)
        self._frame_parts: dict[str, tuple[Any, tuple[str, ...]]] = {}
        # (pred, the unit's frame shapes) -> its plan (see _plan), or None (no plan: render)
        self._plans: dict[Any, Any] = {}
        self._plan_ok = self._split is not None and self._split_is_prefix_free()
        self._search: Any = self._split.__self__.search if self._split is not None else None
        # the added tokens' first two characters (the whole token if it is shorter), grouped by
        # their first character (``head_groups``), and first characters: a text run that holds
        # none of the former and does not end in one of the latter holds no added token and
        # cannot run into the next one (``_plan_texts`` then skips the regex search; a match
        # would start with one of them; an empty token's head "" is in every text: no groups,
        # the search always runs)
        contents = [t.content for t in tok.get_added_tokens_decoder().values()]
        self._token_head_groups = _tc.head_groups(tuple(sorted({c[:2] for c in contents})))
        self._token_firsts: str = "".join(sorted({c[0] for c in contents if c}))
        # the same tokens by first character, a search each (a long run's check: _tc.holds_token)
        self._token_searches: tuple[tuple[str, Any], ...] = _tc.token_searches(contents)
        self._memo: dict[int, tuple[Any, ...]] = {}  # id(message) -> (weakref, snapshot, dict, key)
        # message key -> template dict (untracked by the garbage collector: see _tc.put_untracked)
        self._by_key: dict[str, dict[str, Any]] = _tc.settle(dict(_STANDIN_DICTS))
        self._key_chars = sum(map(len, self._by_key))  # characters of the keys it holds (see MAX_KEY_CHARS)
        self._max_key_chars = int(self.MAX_KEY_CHARS)
        self._texts: dict[Any, int] = {}  # key of a rendered conversation -> tokens
        # (unit keys, pred, succ) -> per-message costs, a tuple: the cyclic garbage collector
        # stops tracking a tuple of ints, not a list, and an eval run of thousands of
        # conversations through one counter spends most of a turn in full collections, which
        # come as often as turns leave tracked objects
        self._units: dict[Any, Any] = {}
        # unit keys -> per-message costs, for units (not tool-first) without reasoning whose
        # cost does not depend on their neighbours: the hot loop's one lookup per unit
        self._local_units: dict[tuple[str, ...], tuple[int, ...]] = {}
        self._local: dict[Any, bool] = {}  # role pattern -> neighbour-independent?
        # value run -> the one object every plan holds for it (_build_plan)
        self._run_forms: dict[Any, Any] = {}
        # frames are shared by the counters of one tokenizer file, template, special tokens and
        # template variables in this process, so a counter built per task or worker does not
        # learn them again
        if digest is not None:
            try:
                shared = (digest, template, json.dumps(special, sort_keys=True),
                          json.dumps(self.template_kwargs, sort_keys=True), self.content_format)
            except (TypeError, ValueError):
                shared = None
            if shared is not None:
                with _TABLES_LOCK:
                    self._frames._frames = _FRAME_TABLES.setdefault(shared, {})
                    self._plans = _PLAN_TABLES.setdefault(shared, {})
                    self._run_forms = _RUN_TABLES.setdefault(shared, {})
                    self._tools_parts_of, self._marginals = _TOOLS_TABLES.setdefault(shared, ({}, {}))
        # message key -> (_lookahead, its element of _pattern), once _sensitive is known; a unit
        # that is not local: its keys tuple -> (lookahead, False) (_tc.unit_locality)
        self._looks: dict[Any, tuple[Any, ...]] = {}
        self._calls: dict[str, str] = {}  # tool-call id -> key of the assistant message that made it
        # the last segmented count_messages call: its keys, unit starts, unit costs, their total
        # and where its last final answer and its last user message stand (-1: none, or not
        # under _final_rule, _query_rule)
        self._last: Optional[tuple[list[Any], list[int], list[int], int, int, int]] = None
        # the last count_messages call's messages (a copy; immutable Messages only), keys and dicts:
        # call_entries matches the next call's messages to them by identity (see there)
        self._last_ms: Optional[tuple[list[Any], list[str], list[dict[str, Any]]]] = None
        # the last prompt tools_signature read the roles of: its keys, where its system and its
        # user messages stand (role_positions: the next prompt's shared messages are not read)
        self._role_pos: Optional[tuple[list[str], list[int], list[int]]] = None
        #: units costed before a user stand-in whatever follows them (see _blind_check)
        self._succ_blind = False
        #: a unit costs what it costs before a stand-in of its successor, followed by a final
        #: answer (a plain assistant message) where the conversation has one after it (gpt-oss
        #: shows a call's text only while no final answer follows); see _final_check
        self._final_rule = False
        #: an assistant message's reasoning (and ``</think>`` text) is printed only after the
        #: last user message (Qwen3): a unit holding it there is costed before stand-ins of its
        #: successor and no user message; see _query_check
        self._query_rule = False
        #: an assistant message's reasoning is printed (a call's) only while no final answer
        #: follows it (gpt-oss), which ``_final_rule`` costs: see _final_reasoning_check
        self._final_reasoning = False
        #: a unit right after a system message is costed after that message itself, not a
        #: stand-in (see _system_pred_check)
        self._real_system_pred = False
        self._ends: dict[str, Optional[int]] = {}
        ends = [e for e in (self._end_cost(r) for r in ("user", "tool", "assistant")) if e is not None]
        self._empty = max(ends) if ends else self._fixed_cost()
        #: text features whose cost depends on what follows them in the conversation (probed
        #: here; a call with such a message is rendered whole, like one with reasoning)
        self._sensitive: frozenset[str] = frozenset()
        self.additive: bool = self._self_check() or self._blind_check()
        if self._reads_reasoning():  # (else an assistant's reasoning changes nothing: left out, see there)
            self._sensitive = frozenset({"reasoning"})
        if self.additive:
            self._sensitive = self._sensitive | frozenset(
                f for f, probes in _FEATURE_PROBES.items() if not self._probes_add_up(probes))
            if "call_text" in self._sensitive:
                self._final_check()
            if self._sensitive & {"after_system", "call_after_system"}:
                self._system_pred_check()
            if self._sensitive & {"after_system", "call_after_system"}:  # (no fallback per call for it)
                self.additive = False
        if self.additive and "reasoning" in self._sensitive and not (self._final_rule or self._succ_blind):
            self._query_check()
        if self.additive and "reasoning" in self._sensitive and self._final_rule:
            self._final_reasoning_check()
        self._local_units = {}
        self._looks = {}
        for n_calls in range(1, 4):  # probe the usual unit patterns once, not in the hot loop
            for text in ("", "."):  # calls alone, and with a line of text ("Let me check.")
                call: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": [{}] * n_calls}
                self._is_local([call] + [{"role": "tool"}] * n_calls)
        for role in ("system", "user", "assistant"):
            self._is_local([{"role": role}])

    #: below this many characters, the hot path encodes a batch on fastokens text by text
    _FAST_LOOP_CHARS = _encodings.FASTOKENS_LOOP_CHARS
    # the hot path, from jianmu_fast._template_core (tests/test_template_core.py binds each build's)
    count_messages = _tc.count_messages
    _count_list = _tc.count_list
    _turn_list = _tc.turn_list
    _prefill_units = _tc.prefill_units
    _plan = _tc.plan
    _plan_texts = _tc.plan_texts
    _planned_cost = _tc.planned_cost
    _upper_costs = _tc.upper_costs
    _piece_counts = _tc.piece_counts
    _frame_part = _tc.frame_part
    _entries_stable = _tc.entries_stable
    _call_entries = _tc.call_entries
    _user_repeats = _tc.user_repeats
    _tools_signature = _tc.tools_signature
    _entry = _tc.entry
    _any_lookahead = _tc.any_lookahead
    _trait = _tc.trait
    _overlap = _tc.overlap
    _segments = _tc.segments
    _unit_total = _tc.unit_total
    _store_all = _tc.store_all

    def __repr__(self) -> str:
        tail = f", engine={self.engine!r}" if self.engine != "auto" else ""
        if self._content_format_arg is not None:
            tail += f", content_format={self._content_format_arg!r}"
        if self.path:
            return f"ChatTemplateTokenCounter({self.path!r}{tail})"
        return f"ChatTemplateTokenCounter(<tokenizers.Tokenizer>{tail})"

    @property
    def engine_in_use(self) -> str:
        """``"fastokens"`` when this counter tokenizes with fastokens, else ``"tokenizers"``."""
        return "tokenizers" if self._fast is None else "fastokens"

    # -- rendering -------------------------------------------------------------------------

    def render(
        self, messages: Sequence[Any], tools: Optional[Sequence[Mapping[str, Any]]] = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The template rendered over ``messages`` (Messages, chat-completions dicts or template
        dicts) and ``tools``, as ``apply_chat_template(..., tokenize=False)`` returns it."""
        if tools is not None and self._tool_use_template is not None:
            return self._tools_counter().render(messages, tools, add_generation_prompt)
        dicts = [d for _, d in (self._entry(m, i) for i, m in enumerate(messages))]
        try:
            return self._render(dicts, tools, add_generation_prompt)
        except _Refused as exc:
            raise MessageValidationError(f"the chat template refused the conversation: {exc}") from None

    def _render(self, dicts: list[dict[str, Any]], tools: Any, agp: bool) -> str:
        import jinja2

        kwargs = {**self.special_tokens, **self.template_kwargs}
        if self._content_format == "openai":  # every content a list of text blocks (see _formatted)
            dicts = [_as_blocks(d) for d in dicts]
        try:  # the immutable sandbox cannot change the dicts: no copies needed
            return self._template.render(
                messages=dicts, tools=tools, documents=None, add_generation_prompt=agp, **kwargs,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise _Refused(str(exc.message if getattr(exc, "message", None) else exc)) from exc
        except Exception as exc:
            raise _Refused(f"{type(exc).__name__}: {exc}") from exc

    def _formatted(self, m: Message, i: int) -> Message:
        """``m`` with the content vLLM gives this counter's ``content_format``: under "string"
        its text (a block list joined, ``None`` as ""); under "openai" a block list normalized
        (an explicit "" as one empty text block). A string content under "openai" stays one
        here -- message keys, frames and the hot path read strings -- and becomes its block
        when rendered (``_as_blocks``), as ``None`` becomes ``[]``."""
        where = f"messages[{i}]"
        if self._content_format == "string":
            return m.model_copy(update={"content": string_content(m.content, where)})
        return m.model_copy(update={"content": openai_content(m.content, where)})

    def _render_plain(self, dicts: list[dict[str, Any]]) -> str:
        return self._render(dicts, None, True)

    def _count(self, text: str) -> int:
        """Tokens of a rendering, as ``tokenizer.encode(text, add_special_tokens=False)``
        counts them; piece by piece between added tokens where that is exact (cached)."""
        return self._count_many((text,))[0]

    def _encode_lengths(self, texts: list[str]) -> list[int]:
        """``len(encode(t, add_special_tokens=False))`` for each text, in one batch call (no
        offsets where the tokenizer offers that; the batch runs on every core)."""
        fast = self._fast
        if fast is None and self._auto_chars >= 0:  # engine="auto", not decided yet
            self._auto_chars, fast = _encodings.hf_auto_step(self, self._digest, texts, "ChatTemplateTokenCounter")
        if fast is not None:
            try:
                return _encodings.fastokens_counts(fast, texts)
            except Exception:  # tokenizers' own outcome, below
                pass
        if len(texts) == 1 and len(texts[0]) < _SHORT:  # see _SHORT
            return [len(self._tok.encode(texts[0], add_special_tokens=False))]
        return [len(e) for e in self._encode_batch(texts, add_special_tokens=False)]

    def _count_many(self, texts: Sequence[str]) -> list[int]:
        """``_count`` of each text, encoding every piece not seen before in one batch."""
        split = self._split
        if split is None:
            return self._encode_lengths(list(texts))
        pieces = self._pieces
        totals: list[int] = []
        parts_of: list[Optional[list[str]]] = []
        missing: dict[str, None] = {}
        for text in texts:
            parts = split(text)
            total = len(parts) // 2  # the added tokens between the pieces
            lacking = False
            for piece in parts[::2]:
                if piece:
                    n = pieces.get(piece)
                    if n is None:
                        missing[piece] = None
                        lacking = True
                    else:
                        total += n
            totals.append(total)
            parts_of.append(parts if lacking else None)
        if not missing:
            return totals
        new = list(missing)
        found = dict(zip(new, self._encode_lengths(new)))
        self._store_all(pieces, found)
        for i, parts in enumerate(parts_of):
            if parts is not None:
                totals[i] += sum(found[piece] for piece in parts[::2] if piece in found)
        return totals

    def _piecewise_splitter(self) -> Any:
        """A function splitting text around the tokenizer's added tokens, when counting the
        pieces apart is exact: the tokenizer extracts added tokens first and encodes what lies
        between them independently -- unless an added token strips whitespace or matches
        normalized text, or a Metaspace/Prepend step treats the start of the text specially.
        ``None`` otherwise (then each rendering is encoded whole)."""
        import re

        tok = self._tok
        steps = ""
        for step in (tok.normalizer, tok.pre_tokenizer):
            if step is not None:
                try:
                    steps += step.__getstate__().decode("utf-8", "replace")
                except Exception:
                    return None
        if "Metaspace" in steps or "Prepend" in steps:
            return None
        contents = []
        for t in tok.get_added_tokens_decoder().values():
            if t.lstrip or t.rstrip or t.single_word or (t.normalized and not t.special):
                return None
            contents.append(t.content)
        if not contents:
            return None
        pattern = re.compile("(" + "|".join(re.escape(c) for c in sorted(contents, key=len, reverse=True)) + ")")
        return pattern.split

    def _split_is_prefix_free(self) -> bool:
        """Whether no added token's text holds another's (then a text run between added tokens
        that holds none, and does not run into the next one, splits as the plan says; see
        ``_plan``)."""
        tokens = [t.content for t in self._tok.get_added_tokens_decoder().values()]
        return not any(a != b and a in b for a in tokens for b in tokens)

    # -- unit plans: a new unit's costs from its field values, without assembling renderings --

    def _build_plan(self, t0: int, frames: list[Any]) -> Any:
        """``_plan``'s plan from the prefix frames (``t0``: the tokens of the stand-ins alone)."""
        split = self._split
        run_ids: dict[Any, int] = {}
        ops: dict[Any, None] = {}
        steps = []
        prev_const, prev_runs = t0, collections.Counter()  # type: ignore[var-annotated]
        for pieces, slots, frame_ops in frames:
            ops.update(dict.fromkeys(frame_ops))
            runs: collections.Counter = collections.Counter()
            fixed: list[str] = []
            n_added = 0
            items: list[Any] = []

            def close(next_token: str) -> None:
                merged: list[Any] = []
                for x in items:  # adjacent fixed texts joined, empty ones dropped
                    if type(x) is str and merged and type(merged[-1]) is str:
                        merged[-1] += x
                    elif x != "":
                        merged.append(x)
                if any(type(x) is int for x in merged):
                    runs[(tuple(merged), next_token)] += 1
                elif merged:
                    fixed.append(merged[0])

            for i, piece in enumerate(pieces):
                parts = split(piece)
                items.append(parts[0])
                for t in range(1, len(parts), 2):
                    close(parts[t])
                    n_added += 1
                    items = [parts[t + 1]]
                if i < len(slots):
                    items.append(slots[i])
            close("")
            const = n_added + sum(self._count_many(fixed))
            for run in runs:
                run_ids.setdefault(run, len(run_ids))
            plus = tuple(run_ids[r] for r in (runs - prev_runs).elements())
            minus = tuple(run_ids[r] for r in (prev_runs - runs).elements())
            steps.append((const - prev_const, plus, minus))
            prev_const, prev_runs = const, runs
        # each run as the one object every plan holds for it (a unit costed again between other
        # neighbours, the first after a moved cut, has other plans with equal runs: compared by
        # identity first where planned_costs collects a unit's runs, held once). The long runs'
        # texts are kept by their form, not by the run object (_tc.run_text), so a run that is
        # not the shared one (after a clear) is still found there
        forms = self._run_forms
        if len(forms) >= 4 * self.cache_size:
            forms.clear()  # (sharing lost, not counts)
        return tuple(ops), tuple([forms.setdefault(r, r) for r in run_ids]), tuple(steps)

    def _tokens(self, keys: tuple[Any, ...], dicts: Optional[list[dict[str, Any]]] = None, tools_key: Any = None,
                tools: Any = None) -> int:
        """Tokens of the conversation whose message keys are ``keys`` (cached by them)."""
        ck = (keys, tools_key)
        n = self._texts.get(ck)
        if n is None:
            if dicts is None:
                dicts = self._dicts_of(keys)
            n = self._count(self._render(dicts, tools, True))
            self._store({ck: n})
        return n

    def _store(self, found: Mapping[Any, int]) -> None:
        self._store_all(self._texts, found)

    def _prefill(self, convs: Sequence[tuple[str, ...]], conv_dicts: Optional[Sequence[list[dict[str, Any]]]] = None) -> None:
        """Render the conversations (message keys, no tools) not counted yet and count them
        in one tokenizer batch; one the template refuses is left for ``_tokens`` to report.
        ``conv_dicts``: their template dicts, where the caller has them."""
        texts = self._texts
        todo: dict[Any, str] = {}
        parts_of = self._frame_parts
        for i, keys in enumerate(convs):
            ck = (keys, None)
            if ck in texts or ck in todo:
                continue
            dicts = conv_dicts[i] if conv_dicts is not None else self._dicts_of(keys)
            try:
                if self._RENDER_FREE:
                    parts = [parts_of.get(k) or self._frame_part(k, d) for k, d in zip(keys, dicts)]
                    todo[ck] = self._frames.render(dicts, parts)
                else:
                    todo[ck] = self._render(dicts, None, True)
            except _Refused:
                continue
        if todo:
            self._store(dict(zip(todo, self._count_many(list(todo.values())))))

    def _dicts_of(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        """The template dicts of message keys: the dict ``_entry`` made (the sandbox cannot
        change it, so one dict serves every rendering), or the key parsed back."""
        by_key = self._by_key
        return [by_key.get(k) or _parse_key(k) for k in keys]

    # -- messages -> template dicts, memoized by identity -------------------------------------

    # -- unit costs ------------------------------------------------------------------------------

    def _unit_cost(self, keys: tuple[str, ...], pred: str, succ: str, caller: Optional[str] = None,
                   prefilled: bool = False) -> tuple[int, ...]:
        """Per-message costs of the unit ``keys`` between stand-ins for ``pred`` and ``succ``
        (a tuple, as the unit caches hold them).

        The unit is always followed by at least one stand-in ending on a user message (``succ``
        "end" is counted as "user"), so nothing a template does to a conversation's last message
        falls on it; that end effect is ``_end_cost``'s."""
        succ = _tc.unit_succ(self, succ)
        ck = (keys, pred, succ, caller)
        costs = self._units.get(ck)
        if costs is not None:
            return costs
        pre, post = self._context(pred, succ, caller)
        if pred == "first" and succ in ("system", "system_final") and caller is None:
            first = self._first_before_system(keys, post)
            if first is not None:
                first = tuple(first)
                self._store_all(self._units, {ck: first})
                return first
        if not prefilled and caller is None:  # from its plan, where the unit follows one: no rendering
            planned = self._planned_cost(keys, pred, succ)
            if planned is not None:
                planned = tuple(planned)
                self._store_all(self._units, {ck: planned})
                return planned
        elif not prefilled and pred == "system":  # after the real system message (``pre`` is it):
            # the plan of the two as a conversation's first messages, less the system message's
            planned = self._planned_cost((caller,) + keys, "first", succ)
            if planned is not None:
                planned = tuple(planned[1:])
                self._store_all(self._units, {ck: planned})
                return planned
        if not prefilled:  # (``_prefill_units`` has rendered and counted them in its batch)
            self._prefill([pre + post] + [pre + keys[:j] + post for j in range(1, len(keys) + 1)])
        prev = self._tokens(pre + post)
        costs = []
        for j in range(1, len(keys) + 1):
            cur = self._tokens(pre + keys[:j] + post)
            costs.append(cur - prev)
            prev = cur
        costs = tuple(costs)
        self._store_all(self._units, {ck: costs})
        return costs

    def _first_before_system(self, keys: tuple[str, ...], post: tuple[str, ...]) -> Optional[list[int]]:
        """The per-message costs of a unit that opens the conversation and is followed by a
        system message, or None (then the plain difference). Without the unit the system
        stand-in after it would open the conversation, which a template may render otherwise
        (Llama 3.1 prints a first system message in its header, any later one as a block of
        its own): for each prefix of the unit, the probe's count less what the stand-ins after
        it cost where they stand (after the prefix's last role) and the end cost; a message
        costs what its prefix adds. Units of several messages too: a window that opens on a
        system message with orphan tool results, or on a call with its results."""
        end = self._end_cost("user")
        if end is None:
            return None
        dicts = self._dicts_of(keys)
        after = sum(self._unit_cost(post[1:], "system", "end"))
        costs: list[int] = []
        prev = 0
        for j in range(1, len(keys) + 1):
            role = self._role_of(dicts[j - 1])
            if role not in _PRE:
                return None
            total = self._tokens(keys[:j] + post) - sum(self._unit_cost(post[:1], role, "user")) - after - end
            costs.append(total - prev)
            prev = total
        return costs

    @staticmethod
    def _context(pred: str, succ: str, caller: Optional[str] = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The stand-in keys before and after a unit (``succ`` "end" counts as "user")."""
        if succ == "end":
            succ = "user"
        pre = _PRE_KEYS[pred]
        if pred == "system" and succ[-4:] == "kept":  # (a user message before it: see _POST)
            pre = _PRE_SYSTEM_KEPT
        if caller is not None and pred == "system":  # the real system message stands before
            pre = (caller,)
        elif caller is not None:  # the real assistant message that made the calls stands before
            pre = pre[:2] + (caller,) + pre[3:]
        return pre, () if succ == "open" else _POST_KEYS[succ]

    def _end_cost(self, last_role: str) -> Optional[int]:
        """What a request costs beyond its units' costs when its last message has
        ``last_role`` (``user`` or ``tool``): the template's fixed text, its generation prompt
        and whatever it does at the end (closing a tool block). ``None`` if the template
        refuses the probe. Calibrated on a probe conversation of stand-ins."""
        if last_role in self._ends:
            return self._ends[last_role]
        u, call, tool = json.dumps(_S_USER), json.dumps(_S_CALL), json.dumps(_S_TOOL)
        try:
            if last_role == "user":
                value: Optional[int] = self._tokens((u,)) - sum(self._unit_cost((u,), "first", "user"))
            elif last_role == "tool":
                value = (self._tokens((u, call, tool)) - sum(self._unit_cost((u,), "first", "assistant"))
                         - sum(self._unit_cost((call, tool), "user", "user")))
            elif last_role == "assistant":
                a = json.dumps(_S_ASST)
                value = (self._tokens((u, a)) - sum(self._unit_cost((u,), "first", "assistant"))
                         - sum(self._unit_cost((a,), "user", "user")))
            else:
                value = None
        except _Refused:
            value = None
        self._ends[last_role] = value
        return value

    def _pattern(self, dicts: Sequence[dict[str, Any]]) -> tuple[Any, ...]:
        return tuple((d["role"], len(d.get("tool_calls") or ()), _has_reasoning(d), *_text_features(d)) for d in dicts)

    def _lookahead(self, d: Mapping[str, Any]) -> bool:
        """Whether what message ``d`` costs may depend on messages after its unit: reasoning
        the template reads (``_reads_reasoning``; on a message of another role, any), or a
        text feature the self-check found the template to look ahead for (rendered whole by
        ``count_messages``), or a call's text under ``_final_rule`` (counted from segments,
        charged the most it costs by ``count_array``)."""
        if _has_reasoning(d) and ("reasoning" in self._sensitive or d.get("role") != "assistant"):
            return True
        if self._final_rule and _text_features(d)[0]:
            return True
        if self._sensitive:
            call_text, think_text = _text_features(d)
            return (call_text and "call_text" in self._sensitive) or (think_text and "think_text" in self._sensitive)
        return False

    def _is_local(self, dicts: Sequence[dict[str, Any]], keys: Optional[Sequence[str]] = None,
                  final: bool = False) -> bool:
        """Whether a unit with this role pattern costs the same whatever stands around it,
        probed once with stand-in messages of the same pattern (its total cost before every
        neighbour it may have, and before every role that may follow it). ``keys``: the
        messages' keys (their pattern elements are cached by them). ``final`` (under
        ``_final_rule``): whether it costs one thing wherever no final answer follows it and
        one wherever one does (gpt-oss's call with reasoning: shown, or not)."""
        if keys is not None:
            trait = self._trait
            pat = tuple([trait(k, d)[1] for k, d in zip(keys, dicts)])
        else:
            pat = self._pattern(dicts)
        if final:
            return self._final_local(pat)
        local = self._local.get(pat)
        if local is None:
            keys = tuple(json.dumps(d) for d in self._canonical_unit(pat))
            seen = set()
            for pred in self._preds(pat[0][0], None):
                for succ in ("user",) if self._succ_blind else ("user", "assistant", "system"):
                    if pred == "first" and succ == "system":  # the stand-in would open the chat
                        continue
                    got = self._canonical_cost(keys, pred, succ)
                    if got is not None:
                        seen.add(got)
            local = len(seen) == 1  # (a pattern every neighbour refuses proves nothing: not local)
            self._store_all(self._local, {pat: local})
        return local

    def _final_local(self, pat: tuple[Any, ...]) -> bool:
        """``_is_local(.., final=True)`` for the pattern ``pat``: its stand-in unit's costs before
        successors with no final answer after them (a user or system message) and before those
        with one (an answer; a user or system message, then an answer) are one value each."""
        local = self._local.get(("final", pat))
        if local is None:
            keys = tuple(json.dumps(d) for d in self._canonical_unit(pat))
            groups: tuple[set[int], set[int]] = (set(), set())
            for pred in self._preds(pat[0][0], None):
                for succ in ("user", "system", "assistant", "user_final", "system_final"):
                    if pred == "first" and succ in ("system", "system_final"):
                        continue
                    got = self._canonical_cost(keys, pred, succ)
                    if got is not None:
                        groups[succ not in ("user", "system")].add(got)
            local = len(groups[0]) == 1 and len(groups[1]) == 1
            self._store_all(self._local, {("final", pat): local})
        return local

    def _canonical_cost(self, keys: tuple[str, ...], pred: str, succ: str) -> Optional[int]:
        """What the stand-in unit ``keys`` costs between the stand-ins ``pred`` and ``succ``;
        None where the template refuses it."""
        pre = tuple(json.dumps(d) for d in _PRE[pred])
        post = tuple(json.dumps(d) for d in _POST[succ])
        try:
            return self._tokens(pre + keys + post) - self._tokens(pre + post)
        except _Refused:
            return None

    @staticmethod
    def _canonical_unit(pat: tuple[Any, ...]) -> list[dict[str, Any]]:
        """Stand-in messages of the pattern ``pat`` (see ``_pattern``)."""
        canon = []
        for n, (role, calls, reasoning, call_text, think_text) in enumerate(pat):
            d: dict[str, Any] = {"role": role, "content": f"x{n}"}
            if think_text:
                d["content"] = f"<think>\nt\n</think>\n\nx{n}"
            if calls:
                if not call_text:
                    d["content"] = ""
                d["tool_calls"] = [
                    {"id": f"c{n}_{k}", "type": "function", "function": {"name": "g", "arguments": {"a": k}}}
                    for k in range(calls)
                ]
            if role == "tool":
                d["tool_call_id"] = f"c{n}"
                d["name"] = "g"
            if reasoning:
                d["reasoning_content"] = d["thinking"] = "r"
            canon.append(d)
        return canon

    #: the neighbours a unit may have before it in a kept prompt (see _tc.unit_preds)
    _preds = staticmethod(_tc.unit_preds)

    @staticmethod
    def _canonical(first_role: str) -> str:
        """The neighbour before a unit whose cost does not depend on its neighbours: none (the
        smallest rendering), or the call a tool-first unit answers."""
        return "call" if first_role == "tool" else "first"

    def _remember_local(self, keys: tuple[str, ...], costs: Sequence[int]) -> None:
        self._store_all(self._local_units, {keys: costs if type(costs) is tuple else tuple(costs)})

    # -- the public API ---------------------------------------------------------------------------

    #: a message's role as a unit's neighbour (see _tc.role_of)
    _role_of = staticmethod(_tc.role_of)

    def _entries(self, ms: Sequence[Any]) -> tuple[list[str], list[dict[str, Any]]]:
        """Keys and template dicts of ``ms``."""
        keys, dicts, _ = self._entries_stable(ms)
        return keys, dicts

    @staticmethod
    def _starts(dicts: Sequence[Mapping[str, Any]]) -> list[int]:
        return [i for i, d in enumerate(dicts) if i == 0 or d["role"] != "tool"]

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` alone, encoded as the template's output is (added tokens match).

        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
        >>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> ChatTemplateTokenCounter(tok, "{{ messages }}").count_text("a b c")
        3
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._count(text)

    def _full(self, keys: list[str], dicts: list[dict[str, Any]], tools: Any = None, tools_key: Any = None) -> int:
        try:
            return self._tokens(tuple(keys), dicts, tools_key, tools)
        except _Refused as exc:
            raise MessageValidationError(f"the chat template refused the conversation: {exc}") from None

    def count_message(self, message: Any) -> int:
        """What ``message`` adds to a request, as ``count_array([message])`` counts it."""
        return int(self.count_array([message])[0])

    def count_array(self, messages: Sequence[Any]) -> np.ndarray:
        """One int64 cost per message (see the module docstring): summed over a kept prompt,
        plus ``count_messages([])``, never below its exact count, and equal for units whose
        rendering does not depend on their neighbours."""
        return np.array(self._count_list(messages), dtype=np.int64)

    def count_tools(self, tools_schema: Optional[Sequence[Mapping[str, Any]]], messages: Optional[Sequence[Any]] = None) -> int:
        """Marginal tokens of ``tools_schema`` in a request of ``messages``: the exact count
        with the tools minus ``count_messages(messages)``, so ``count_messages(ms) +
        count_tools(tools, ms)`` is the request's exact count.

        Without ``messages`` (what a budget charges for the request's tools): the larger of
        the marginal costs after one user message and after a system and a user message --
        templates place the tools differently when a system message leads (DeepSeek-V3's
        cost one token more there), and a budget of ``count_messages`` plus this must hold
        for either.

        Templates put tools in many places (a system block, the first or the last user message,
        Mistral's template even once per user message equal to the last one). Probes run the
        first time a tool list is counted with messages (``_tools_parts``) find what its cost
        depends on; where it is only the prompt's first message, its system messages, the
        first message after them and its first and last user messages (each of these three
        where the probes show it matters), how many user messages repeat the last one and the
        last message's role (``tools_signature``), the cost is cached by those (a hot-loop turn
        looks it up: no rendering), and a prompt of a new signature is costed on a short prompt
        of that signature (``_short_marginal``: its first units, those around its last user
        message and its last unit); otherwise the whole request is rendered with the tools.

        A model that names a ``"tool_use"`` template besides its default one (Hermes 2 Pro,
        Command R) is rendered by it when the request carries tools (``tools`` not None, an
        empty list too), as transformers and vLLM pick it: the marginal cost is then that
        request's exact count minus ``count_messages`` (which renders by the default one).
        """
        if self._tool_use_template is None or tools_schema is None:
            if not tools_schema:
                return 0
        elif messages:  # (without messages, count_request below renders by "tool_use")
            ms = list(messages)
            t = self._tools_counter()
            return t.count_messages(ms) + t.count_tools(tools_schema, ms) - self.count_messages(ms)
        key, tools = self._tools_entry(tools_schema)
        if messages:
            ms = list(messages)
            parts = self._tools_parts_of.get(key, NOT_YET)  # (_tools_parts' table: probed once per list)
            if parts is NOT_YET:
                parts = self._tools_parts(key, tools)
            sig = None
            shape = self._tools_signature(ms, *parts) if parts is not None else None
            if shape is not None:
                sig = (key, *shape)
                got = self._marginals.get(sig)
                if got is not None:
                    return got
            keys, dicts = self._entries(ms)
            got = self._short_marginal(ms, dicts, parts, shape, tools, key) if shape is not None else None
            if got is None:
                got = self._full(keys, dicts, tools, key) - self.count_messages(ms)
            if sig is not None:
                self._store_all(self._marginals, {sig: got})
            return got
        user = {"role": "user", "content": "."}
        cost = self.count_request([user], tools_schema) - self.count_messages([user])
        led = [{"role": "system", "content": "."}, user]
        try:
            return max(cost, self.count_request(led, tools_schema) - self.count_messages(led))
        except MessageValidationError:  # a template that refuses a system message
            return cost

    def _tools_counter(self) -> "ChatTemplateTokenCounter":
        """The counter of the model's "tool_use" template (built on first use; it counts the
        requests with tools, and a budget filter trims those by its charges)."""
        t = self._tool_counter
        if t is None:
            t = self._tool_counter = ChatTemplateTokenCounter(
                self._tok, self._tool_use_template, special_tokens=self.special_tokens,
                template_kwargs=self.template_kwargs, cache_size=self.cache_size, engine=self.engine,
                content_format=self._content_format_arg)
        return t

    def tools_surplus(self, tools_schema: Optional[Sequence[Mapping[str, Any]]], messages: Sequence[Any]) -> int:
        """Tokens ``tools_schema`` cost in the request of ``messages`` beyond
        ``count_tools(tools_schema)`` (what a budget charges for them): 0 unless the template
        prints the tools more than once for these messages. Mistral's prints them before every
        user message equal to the last one, so a prompt repeating its last user message
        verbatim ("continue" ... "continue") pays for them again; the trimming filters trim
        such a prompt further by this surplus (``TokenBudgetFilter.tools_cost(tools, kept)``).

        Cheap for every other prompt: whether the template repeats the tools is probed once
        per tools list (two renderings), and only a prompt holding a user message equal to its
        last one is priced, by ``count_tools(tools, ms)`` (its cost by the prompt's signature,
        which counts those repeats).
        """
        if self._tool_use_template is not None and tools_schema:
            # (a budget filter trims a request with tools by the "tool_use" template's charges)
            return self._tools_counter().tools_surplus(tools_schema, messages)
        if not tools_schema or not messages or not self._repeats_tools(tools_schema):
            return 0
        return self._repeated_surplus(tools_schema, messages)

    def _repeated_surplus(self, tools_schema: Sequence[Mapping[str, Any]], messages: Sequence[Any]) -> int:
        """``tools_surplus`` of tools the template repeats (``_repeats_tools``: a budget filter
        knows it from its cached tools entry, and asks this about each prompt it sends)."""
        ms = list(messages)
        return self._repeat_surplus(tools_schema, ms) if self._user_repeats(ms) else 0

    def _repeat_surplus(self, tools_schema: Sequence[Mapping[str, Any]], ms: list[Any]) -> int:
        """``tools_surplus`` of ``ms`` for tools the template repeats (``_repeats_tools``) and a
        prompt that repeats its last user message (``_user_repeats``): the callers know both."""
        return max(0, self.count_tools(tools_schema, ms) - self.count_tools(tools_schema))

    def _repeats_tools(self, tools_schema: Sequence[Mapping[str, Any]]) -> bool:
        """Whether the tools cost more after ``[u, a, u]`` than after ``[u', a, u]`` (the
        template prints them again for a user message equal to the last one)."""
        key = json.dumps(list(tools_schema), sort_keys=True, default=repr)
        got = self._tools_repeat.get(key)
        if got is None:
            a = {"role": "assistant", "content": "a"}
            u = {"role": "user", "content": "."}
            try:
                got = self.count_tools(tools_schema, [u, a, u]) != self.count_tools(
                    tools_schema, [{"role": "user", "content": ","}, a, u])
            except MessageValidationError:  # a template that refuses the shape repeats nothing in it
                got = False
            if len(self._tools_repeat) >= 16:
                self._tools_repeat.pop(next(iter(self._tools_repeat)))
            self._tools_repeat[key] = got
        return got

    def count_request(self, messages: Sequence[Any], tools_schema: Optional[Sequence[Mapping[str, Any]]] = None) -> int:
        """Exact tokens of a whole request, by one full rendering (what the others must sum to)."""
        if self._tool_use_template is not None and tools_schema is not None:
            return self._tools_counter().count_request(messages, tools_schema)
        ms = list(messages)
        keys, dicts = self._entries(ms)
        if not tools_schema:
            return self._full(keys, dicts) if ms else self._empty
        key, tools = self._tools_entry(tools_schema)
        return self._full(keys, dicts, tools, key)

    def _tools_entry(self, tools_schema: Sequence[Mapping[str, Any]]) -> tuple[str, list[Any]]:
        """``(key, tools)``: the tools as the template receives them (their JSON, parsed back)
        and that JSON, the caches' key; checked (``iter_functions``: bad input names
        ``tools_schema[i]``). The last list's entry is reused while the next one is the same
        JSON value (an agent sends the same tools every turn, at times as a new list; no
        serializing then): the same list, or a new list of the same tool dicts (a framework
        listing its tools again), where no list or dict in it changed since (``json_unchanged``:
        identity checks against a snapshot of its containers, ~1.8 us for 14 tools; ``==``
        against a copy took ~3.4 us and passed an int edited into an equal float in place,
        which prints otherwise), or a list that is ``same_json`` as the entry's copy (equal
        values of equal types, keys in the same order: ~8 us), which the entry then keeps as
        its list (the next turn passing it again takes the first path, once its snapshot is
        taken: at the entry's creation, else when the list it keeps comes a second time)."""
        seen = self._tools_seen
        if seen is not None:
            snap = seen[3]
            if snap is not None and _tc.json_unchanged(snap, tools_schema):
                return seen[1]
            if _tc.same_json(seen[0], tools_schema):
                # snapshot a list passed a second time (~28 us for 14 tools: not every turn of an
                # agent that builds its list anew each turn)
                snap = _tc.json_snapshot(tools_schema) if tools_schema is seen[2] else None
                self._tools_seen = (seen[0], seen[1], tools_schema, snap)
                return seen[1]
        from ._tools_count import iter_functions

        iter_functions(tools_schema)
        tools = json.loads(json.dumps(list(tools_schema)))
        # (the list, each tool and its function: what templates print with tojson)
        _remember_json([tools, *tools, *(t["function"] for t in tools if isinstance(t, dict)
                                           and isinstance(t.get("function"), dict))])
        entry = (json.dumps(tools), tools)
        self._tools_seen = (copy.deepcopy(tools_schema), entry, tools_schema, _tc.json_snapshot(tools_schema))
        return entry

    def _short_marginal(self, ms: list[Any], dicts: list[dict[str, Any]], parts: tuple, shape: tuple, tools: Any,
                        key: str) -> Optional[int]:
        """``count_tools``' marginal for a prompt whose tools signature (``shape``) is not cached
        yet, from a shorter prompt with the same signature: its first units up to the one after
        the first user message, the units around the last user message, and its last unit
        (with every user message equal to the last one). A signature names all that the
        marginal depends on (what the probes checked, and what the cache of marginals
        relies on: a prompt seen before with that signature answers for this one), so the
        short prompt's marginal is this one's; it renders a few messages instead of the whole
        prompt (Llama 3.1 prints the tools into the first user message: every new
        conversation, and every cut the trimming moves, is a new signature). None where the
        short prompt is not shorter, has another signature, or the template refuses it (then
        the whole prompt is rendered)."""
        n = len(dicts)
        if n < 8:
            return None
        starts = [i for i in range(n) if i == 0 or dicts[i]["role"] != "tool"]
        users = [i for i in range(n) if dicts[i]["role"] == "user"]
        keep: set[int] = set()

        def unit_of(i: int) -> int:  # the index in starts of the unit holding message i
            return _bisect_right(starts, i) - 1

        def take(u: int) -> None:
            if 0 <= u < len(starts):
                keep.add(u)

        o = 0  # the first message that is not a system message
        while o < n and dicts[o]["role"] == "system":
            o += 1
        # the unit of the first user message (of the first message after the system ones, where
        # no user message is left) and the one after it
        lead = unit_of(users[0] if users else min(o, n - 1))
        for u in range(lead + 2):
            take(u)
        for i in range(n):
            if dicts[i]["role"] == "system":
                take(unit_of(i))
        if users:
            last = dicts[users[-1]]
            for i in users:
                if dicts[i] == last:
                    u = unit_of(i)
                    take(u - 1)
                    take(u)
                    take(u + 1)
        take(len(starts) - 1)
        if len(keep) == len(starts):
            return None
        bounds = starts + [n]
        short = [m for u in sorted(keep) for m in ms[bounds[u]:bounds[u + 1]]]
        saved = (self._last, self._last_ms, self._role_pos)  # (what the calls below keep of the last prompt)
        try:
            if self._tools_signature(short, *parts) != shape:
                return None
            keys, sdicts = self._entries(short)
            return self._full(keys, sdicts, tools, key) - self.count_messages(short)  # (one rendering)
        except MessageValidationError:
            return None
        finally:
            self._last, self._last_ms, self._role_pos = saved

    def _tools_parts(self, key: str, tools: list[Any]) -> Optional[tuple[bool, bool, bool, bool]]:
        """Whether the marginal cost of ``tools`` depends on the prompt's first message that is
        not a system message, on its first and on its last user message, and whether a prompt
        without a user message depends on nothing more than its signature (``(opening,
        first_user, last_user, no_user)``, what ``tools_signature`` then keys it by), or None
        where it depends on more than ``tools_signature`` names (then ``count_tools`` renders
        whole).
        Probed once per tool list (``_probe_tools``)."""
        table = self._tools_parts_of
        if key in table:
            return table[key]
        got = self._probe_tools(key, tools)
        if len(table) >= 64:
            table.pop(next(iter(table)), None)
        table[key] = got
        return got

    def _probe_tools(self, key: str, tools: list[Any]) -> Optional[tuple[bool, bool, bool, bool]]:
        """``_tools_parts`` by rendering small conversations with and without the tools: the
        marginal cost must not change with the messages between the first and the last user
        message, nor with what follows the last one (another tool round, results of other
        text), for each lead (a system message or none, then a user message, an assistant's
        text or a tool round: a trimmed prompt may open with either) and either ending (the
        user, a tool result); then whether it changes with the opening message's text (after
        a system message), the first user message's and the last one's (texts that differ at
        their edges: whitespace, newlines, markup, none); then prompts without a user message,
        each lead with other openings, bodies and endings (``no_user``: at least 16 of them
        accepted, all alike). A conversation the template refuses proves nothing and is
        skipped; a template that accepts fewer than 16 of the first checks' 64 is rendered whole."""
        from ._tools_count import iter_functions

        fn = iter_functions(tools)[0][1]["name"]
        made = [0]

        def call_round(result: str, args: str = "{}") -> list[Message]:
            made[0] += 1
            cid = f"call_{made[0]}"
            return [Message(role="assistant", content=None, tool_calls=[
                        {"id": cid, "type": "function", "function": {"name": fn, "arguments": args}}]),
                    Message(role="tool", content=result, tool_call_id=cid, name=fn)]

        def user(text: str) -> Message:
            return Message(role="user", content=text)

        def said(text: str) -> Message:
            return Message(role="assistant", content=text)

        def marginal(conv: list[Message]) -> Optional[int]:
            try:
                keys, dicts = self._entries(conv)
                return self._full(keys, dicts, tools, key) - self._full(keys, dicts)
            except MessageValidationError:
                return None

        accepted = [0]

        def same(convs: list[list[Message]]) -> bool:
            got = [m for m in (marginal(c) for c in convs) if m is not None]
            accepted[0] += len(got)
            return len(set(got)) <= 1

        system = Message(role="system", content="You are a probe.")
        first, last = user("What is the weather?"), user("And tomorrow?")
        middles = [[said("Sure.")], [*call_round("ok"), said("It is sunny.")],
                   [said("Sure."), user("Thanks."), said("Fine.")],
                   [*call_round('{"t": 21}'), said("Done.\n"), user("\nOk "), *call_round("  "), said("Noted")]]
        tool_ends = [call_round("ok"), call_round("\n\nresult\n"), call_round("a") + call_round("b")]
        texts = ["\n\nWhat is\n", " x ", "", "<b>", "数据"]
        leads: list[list[Message]] = [[system], [], [system, said("Earlier.")], [system, *call_round("old")]]
        for lead in leads:
            for ends in ([[]], tool_ends):
                if not same([lead + [first] + mid + [last] + end for mid in middles for end in ends]):
                    return None
        if accepted[0] < 16:  # (a template that refuses most probes: nothing is known)
            return None
        opening = first_matters = last_matters = False
        for end in ([], tool_ends[0]):
            if not same([[system, said(t), first, said("Sure."), last] + end for t in ["Earlier.", *texts]]) or not same(
                    [[system, *call_round(t, a), first, said("Sure."), last] + end
                     for t, a in [("old", "{}"), ("", '{"city": "Oslo"}'), ("\n\nx", '{"q": [1, 2], "n": null}')]]):
                opening = True
            for lead in leads[:2]:
                if not same([lead + [user(t), said("Sure."), last] + end for t in [first.content, *texts]]):
                    first_matters = True
                if not same([lead + [first, said("Sure."), user(t)] + end for t in [last.content, *texts]]):
                    last_matters = True
                if not (first_matters or last_matters) and not same(
                        [lead + [user(t)] + end for t in [first.content, *texts]]):
                    first_matters = last_matters = True
        # prompts without a user message (a coding agent's, trimmed: tool rounds only): their
        # cost may depend on nothing but what their signature keeps (the first message, the
        # system messages, the opening message where ``opening``, the last role)
        no_user = True
        seen = accepted[0]
        openings = [[said("Earlier.")], call_round("old"), [said("\n\nx ")], call_round("", '{"city": "Oslo"}')]
        bodies: list[list[Message]] = [[], [said("Sure.")], [*call_round("ok"), said("Done.")], call_round('{"t": 21}')]
        for lead in leads[:2]:
            for end in ([said("Fine.")], call_round("z"), call_round("\n\nresult\n") + call_round("b")):
                if lead and not opening:  # the opening message is not in the signature: any
                    groups = [[lead + op + body + end for op in openings for body in bodies]]
                else:  # it is (the first message, or the opening where ``opening``)
                    groups = [[lead + op + body + end for body in bodies] for op in openings]
                for group in groups:
                    no_user = no_user and same(group)
        return opening, first_matters, last_matters, no_user and accepted[0] - seen >= 16

    def __getstate__(self) -> dict[str, Any]:
        """Pickles by model folder (workers reload it; vocabularies are never shipped)."""
        if self.path is None:
            import pickle

            raise pickle.PicklingError(
                "ChatTemplateTokenCounter: a counter built from a tokenizers.Tokenizer cannot be pickled "
                "(vocabularies are never shipped to workers); build it from a model folder instead"
            )
        # (the argument it was built with: None reloads the folder's templates, "tool_use" included)
        return {"path": self.path, "chat_template": self._chat_template_arg, "special_tokens": self.special_tokens,
                "template_kwargs": self.template_kwargs, "cache_size": self.cache_size, "engine": self.engine,
                "content_format": self._content_format_arg}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["chat_template"], special_tokens=state["special_tokens"],  # type: ignore[misc]
                      template_kwargs=state["template_kwargs"], cache_size=state["cache_size"],
                      engine=state.get("engine", "auto"), content_format=state.get("content_format"))

    def clear_cache(self) -> None:
        """Forget cached renderings and costs (the tokenizer and template stay loaded)."""
        with self._lock:
            self._memo = {}
            self._by_key = _tc.settle(dict(_STANDIN_DICTS))
            self._key_chars = sum(map(len, self._by_key))
            self._texts = {}
            self._units = {}
            self._local_units = {}
            self._looks = {}
            self._last = None
            self._last_ms = None
            self._role_pos = None
            self._plans.clear()  # (shared with the counters of this template: a cache all the same)
            self._marginals.clear()  # (shared too)
            self._tools_seen = None
        if self._tool_counter is not None:
            self._tool_counter.clear_cache()

    def _fixed_cost(self) -> int:
        """Tokens the template renders around an empty conversation. Templates that read
        ``messages[0]`` cannot render one (transformers refuses it too): their fixed cost is
        taken as ``T([u]) - (T([u, v]) - T([v]))`` for two user messages ``u``, ``v``, what makes
        segment sums add up, and the self-check verifies it."""
        try:
            return self._tokens(())
        except _Refused:
            pass
        u = json.dumps(_S_USER)
        v = json.dumps(_S_USER2)
        try:
            fixed = self._tokens((u,)) - self._tokens((u, v)) + self._tokens((v,))
        except _Refused as exc:
            raise MessageValidationError(
                f"the chat template cannot render a conversation of one user message: {exc}"
            ) from None
        self._texts[((), None)] = fixed
        return fixed

    # -- the additivity self-check -----------------------------------------------------------------

    def _self_check(self) -> bool:
        """Do segment sums equal full renderings on a few probe conversations? A template that
        refuses a probe is not judged on it; one that refuses every probe is not additive."""
        return self._probes_add_up(_PROBES, need_one=True)

    def _reads_reasoning(self) -> bool:
        """Whether the template prints anything of an assistant message's reasoning
        (``reasoning_content``, ``thinking`` or ``reasoning``, aliased as transformers does):
        conversations of ``_REASONING_PROBES`` rendered with reasoning on every assistant
        message (answers and calls, with text and without, before and after the last user
        message, last or not; with tools and without) and without it. Any rendering that
        differs, or one the template refuses only with reasoning (or every probe refused),
        says it does: then a call with reasoning is rendered whole (Qwen3 strips it before the
        last user query, gpt-oss shows it while no final answer follows); else an assistant
        message's reasoning is left out of its template dict (``_tc.entry``: it renders the
        same, and the message is a frame's like any other) -- Llama 3.1, Mistral, Hermes and
        DeepSeek-V3 print none of it. Reasoning on another role's message is always rendered
        whole (not probed)."""
        tools = [{"type": "function", "function": {"name": "get", "description": "Get a value.",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        judged = 0
        for probe in _REASONING_PROBES:
            for field in _REASONING_FIELDS:
                plain: list[dict[str, Any]] = []
                thought: list[dict[str, Any]] = []
                for m in _probe_messages(probe):
                    plain.append(_tc.message_to_template_dict(m))
                    if m.role == "assistant":
                        m = m.model_copy(update={"extra": {field: "Let me think it over."}})
                    thought.append(_tc.message_to_template_dict(m))
                for t in (None, tools):
                    try:
                        text = self._render(plain, t, True)
                    except _Refused:
                        continue
                    try:
                        if self._render(thought, t, True) != text:
                            return True
                    except _Refused:
                        return True
                    judged += 1
        return judged == 0  # (a template that refuses every probe proves nothing: it may read it)

    def _final_check(self) -> None:
        """Does a call's text add up when each unit is costed before stand-ins of its successor
        and, where the conversation has one after it, of a final answer? Then call text is no
        longer rendered whole (``_final_rule``; ``segments`` finds the last final answer)."""
        self._final_rule = True
        self._sensitive = self._sensitive - {"call_text"}
        self._looks, self._last = {}, None
        if not self._probes_add_up(_FEATURE_PROBES["call_text"] + _FINAL_PROBES):
            self._final_rule = False
            self._sensitive = self._sensitive | {"call_text"}
        self._looks, self._last = {}, None

    def _final_reasoning_check(self) -> None:
        """Under ``_final_rule``: does an assistant message's reasoning add up costed as call
        text is (each unit before stand-ins of its successor and, where the conversation has
        one after it, of a final answer)? Then such calls are no longer rendered whole
        (``_final_reasoning``: gpt-oss shows a call's reasoning as analysis only while no final
        answer follows, and drops an answer's)."""
        self._try_rule("_final_reasoning", _FINAL_REASONING_PROBES)

    def _try_rule(self, flag: str, probes: Sequence[Sequence[tuple[Any, ...]]]) -> None:
        """Turn the counter's ``flag`` on, and leave it on only if ``probes`` add up so."""
        setattr(self, flag, True)
        self._looks, self._last = {}, None
        if not self._probes_add_up(probes, need_one=True):
            setattr(self, flag, False)
        self._looks, self._last = {}, None

    def _query_check(self) -> None:
        """Does an assistant message's reasoning (and ``</think>`` text) add up when each unit
        holding it after the last user message is costed before stand-ins of its successor and
        no user message after them, and every other unit as usual (a user stand-in after it)?
        Then such calls are no longer rendered whole (``_query_rule``: Qwen3 prints the
        reasoning after the last user query, and strips it before)."""
        self._try_rule("_query_rule", _QUERY_PROBES)

    def _system_pred_check(self) -> None:
        """Do assistant messages right after a system message add up when each is costed
        after that system message itself (its text may merge with theirs)? Then they are
        counted from segments so (``_real_system_pred``)."""
        features = ("after_system", "call_after_system")
        self._real_system_pred = True
        self._looks, self._last = {}, None
        if self._probes_add_up([p for f in features for p in _FEATURE_PROBES[f]]):
            self._sensitive = self._sensitive - set(features)
        else:
            self._real_system_pred = False
        self._looks, self._last = {}, None

    def _blind_check(self) -> bool:
        """Do segment sums add up when every unit is costed before a user stand-in, whatever
        follows it? A template that closes a block in the *next* message's rendering
        (DeepSeek-V3 prints ``<｜tool▁outputs▁end｜>`` in the assistant turn after tool
        results, and nothing before a user message) charges that text to both units when each
        is costed before its real successor; costed before a user stand-in (no closing text),
        the text falls on the successor only, which is costed after its real predecessor. On
        success the counter stays in this mode (``_succ_blind``); else it is left as it was."""
        saved = (self._ends, self._empty, self._local)
        self._succ_blind = True
        self._ends, self._local, self._last = {}, {}, None
        ends = [e for e in (self._end_cost(r) for r in ("user", "tool", "assistant")) if e is not None]
        self._empty = max(ends) if ends else self._fixed_cost()
        self._looks = {}
        if self._self_check():
            return True
        self._succ_blind = False
        self._ends, self._empty, self._local = saved
        self._looks, self._last = {}, None
        return False

    def _probes_add_up(self, probes: Sequence[Sequence[tuple[Any, ...]]], need_one: bool = False) -> bool:
        judged = 0
        for probe in probes:
            ms = _probe_messages(probe)
            keys, dicts = self._entries(ms)
            try:
                full = self._tokens(tuple(keys), dicts)
            except _Refused:
                continue
            try:
                self._last = None
                parts = self._segments(ms, keys, dicts)
            except _Refused:
                return False
            finally:
                self._last = None
            if parts != full:
                return False
            judged += 1
        return judged > 0 or not need_one
