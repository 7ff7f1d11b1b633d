"""Exact counts for open models: a hot-loop turn with ``ChatTemplateTokenCounter``.

The seeded tool-calling conversation is replayed model call by model call (a turn appends
what came since the last call: an assistant tool call with its results, or an answer and the
user's next message) over a history of about 40 (or 600) messages. A turn appends them, trims the history to a 8,000-token budget with ``TokenBudgetFilter`` and
counts the prompt that is sent with ``count_messages`` (each round starts from a counter that
has only seen the history before the round, as an agent process would). Peers, same turns:

- ``chat_template``: ``ChatTemplateTokenCounter`` on each bundled template (exact: equals
  transformers' ``apply_chat_template``; checked before timing);
- ``hf``: ``HFTokenCounter`` on the same ``tokenizer.json`` (ChatML-like constants: not the
  model's count);
- ``transformers`` (where installed): what exact counting costs without this counter,
  transformers' own ``apply_chat_template(history, tools=..., tokenize=True)`` over the whole
  history, once per turn (its counts equal ours: ``test_counts_are_exact``);
- ``full_render``: the same work with our renderer (transformers' Jinja environment) and
  tokenizers: 0-40 % faster than transformers'.

Three traces (``CASES``): the seeded conversation at 40 and 600 messages, and the two regimes
of ``test_regimes.py`` -- customer-service eval traffic (a fixed ~1,250-token policy system
prompt, JSON tool results of ~250 tokens; 24 messages, the median conversation) and a coding
agent (a short system prompt, tool outputs up to several thousand tokens; 150 messages, ~30k
tokens, trimmed hard to a 16,000-token budget) -- each cut into turns the same way.

Every row is measured without and with the request's tools (``TOOLS``: the 7 function
schemas the conversation calls; for the regimes, ``test_regimes.tool_schemas()``, 14 schemas
of ~2k tokens); with them a turn trims with ``tools_schema=TOOLS`` and counts
``count_messages(kept) + tools_cost(TOOLS, kept)``, the request's exact count.

Both counters take ``engine=`` ("tokenizers": HuggingFace ``tokenizers``; "fastokens": the
same ``tokenizer.json`` in fastokens; "auto", the default: tokenizers until the counter has
tokenized ``AUTO_FASTOKENS_CHARS`` characters, then fastokens when installed and checked, so a
benchmark round's fresh counter stays on tokenizers). Ratios are like for like (the same engine
on both counters), per engine; the default pair is the "auto" one. ``full_render`` tokenizes the rendering with ``tokenizers`` (what transformers
does); ``full_render_fastokens`` with fastokens (the rendering then dominates).

Every family gets the same seeded conversation, as its template accepts it: Hermes requires a
``name`` on tool results (given the called function's), Llama 3.1 refuses parallel calls (each
is sent as its own call and result), gpt-oss refuses a call's text beside its reasoning (the
``-reasoning`` traces send such a call without its text). DeepSeek-V3's template closes a tool-output block in the
next assistant turn: its units are costed before a user stand-in whatever follows them
(``_succ_blind``); gpt-oss shows a call's text only while no final answer follows: its units
are costed knowing whether one does (``_final_rule``). Both count from segments (they rendered
whole before session 17).

``test_ratios`` measures them interleaved, with each engine (each turn's best of 15 rounds, 3
for full rendering, averaged over the round's turns) and prints chat_template/hf (target <= 2)
and transformers/chat_template, full_render/chat_template (target >= 100) for the defaults,
then per engine. A turn of either counter must tokenize the turn's
new text (about a twentieth of a 40-message history), which bounds full_render/hf, and so any
exact counter's ratio, to roughly 15-25x at 40 messages.

A round collects the garbage (``gc.collect()``) before it builds its counter and warms it on
the history (transformers: renders the history once), not between the warm-up and the first
turn: a full collection walks every object of the process and leaves the caches cold, and the
first count after it took 50-90 us more than the same count after the warm-up (both counters,
fastokens). Until session 31 the rounds collected last, and every round's first turn carried
that into its minimum: cs 24, Mistral, fastokens, 48 -> 27 us a turn, ``HFTokenCounter`` 31 ->
20 us. What collections cost a long run is ``test_eval_regime_ratios``' to measure.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import time

import pytest
from conftest import REPORT, conversation
from traces import conversation_tools

from jianmu_fast.memory.context import ChatTemplateTokenCounter, HFTokenCounter, TokenBudgetFilter
from jianmu_fast.memory.context import _encodings
from jianmu_fast.memory.context.chat_template import message_to_template_dict
from jianmu_fast.message import Message

#: the tokenizing engines measured (fastokens where the [fast] extra is installed)
ENGINES = ["tokenizers"] + (["fastokens"] if importlib.util.find_spec("fastokens") else [])
#: transformers' own apply_chat_template is measured where it is installed (the [dev] extra)
PEERS = ["transformers"] if importlib.util.find_spec("transformers") else []

BUDGET = 8_000
#: the budget of each trace's prompts: a coding agent's newest tool round alone takes up to
#: ~9k tokens with the 14 tools in Hermes' format (``test_regimes.py`` gives it 16,000 too)
BUDGETS = {"seeded": BUDGET, "cs": BUDGET, "coding": 16_000, "cs-blocks": BUDGET, "cs-reasoning": BUDGET,
           "coding-reasoning": 16_000}
TURNS = 10
ROUNDS = int(os.environ.get("JIANMU_FAST_CT_ROUNDS", "15"))
SIZES = [40, 600]
#: the hot loops measured: (trace, history size); ``SIZES`` of the seeded conversation, then
#: the two regimes of ``test_regimes.py`` at their typical sizes: a customer-service
#: conversation of 24 messages (the median) and a coding agent's 150
#: (~30k tokens in all: trimmed hard)
CASES = [("seeded", size) for size in SIZES] + [("cs", 24), ("coding", 150)]


def _trace_name(trace: str) -> str:
    return {"seeded": "", "cs": "customer-service regime, ", "coding": "coding regime, ",
            "cs-blocks": "customer-service regime as content blocks, ",
            "cs-reasoning": "customer-service regime with reasoning, ",
            "coding-reasoning": "coding regime with reasoning, "}[trace]


def _base_trace(trace: str) -> str:
    """The trace a variant (``-blocks``, ``-reasoning``) is made of."""
    return trace.removesuffix("-blocks").removesuffix("-reasoning")


#: words a model's reasoning is made of in the "-reasoning" traces (varied per message)
_THOUGHTS = ("the user wants", "check the order first", "which tool fits", "the result says", "so the next step is",
             "compare it with the policy", "no need to ask again", "summarize for them", "the file has", "run the tests")


def _reasoning(m: Message, n: int) -> str:
    """The reasoning an assistant message ``n`` of a trace carries: ~150-600 characters, opened
    and closed by a newline (what vLLM's reasoning parsers return between ``<think>`` tags)."""
    words = [_THOUGHTS[(n * 7 + i * 3) % len(_THOUGHTS)] for i in range(4 + (n * 5) % 16)]
    return "\n" + f"Message {n}: " + ", ".join(words) + ".\n"
FAMILIES = ["qwen3", "hermes", "llama3.1", "mistral", "gpt-oss", "deepseek-v3"]
#: the request's tools in the "tools" rows: a schema per function the conversation calls
TOOLS = conversation_tools()
_DATA = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "chat_templates")
_spec = importlib.util.spec_from_file_location("_ct_data", os.path.join(_DATA, "make_tokenizer.py"))
mk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return {f: mk.model_dir(f, str(tmp_path_factory.mktemp(f))) for f in FAMILIES}


def _as_family_accepts(msgs: list[Message], family: str) -> list[Message]:
    """The conversation as ``family``'s template accepts it (see the module docstring)."""
    out: list[Message] = []
    names: dict[str, str] = {}
    pending: list[dict] = []  # Llama 3.1: the parallel calls still to send, one per result
    for m in msgs:
        for call in m.tool_calls or ():
            names[call["id"]] = call["function"]["name"]
        if m.role == "tool" and family == "hermes":
            out.append(m.model_copy(update={"name": names.get(m.tool_call_id or "", "tool")}))
        elif family == "gpt-oss" and m.tool_calls and m.content and m.extra.get("reasoning_content"):
            # (gpt-oss refuses a call's text beside its reasoning: the analysis is one or the other)
            out.append(m.model_copy(update={"content": None}))
        elif m.tool_calls and len(m.tool_calls) > 1 and family == "llama3.1":
            out.append(m.model_copy(update={"tool_calls": m.tool_calls[:1]}))
            pending = list(m.tool_calls[1:])
        else:
            out.append(m)
        if m.role == "tool" and pending:
            out.append(Message(role="assistant", content=None, tool_calls=[pending.pop(0)]))
    return out


def _units(msgs: list[Message]) -> list[list[Message]]:
    """The conversation cut before each model call: a turn ends on a user or tool message
    (an assistant's answer and the user's next message are one turn)."""
    out: list[list[Message]] = [[]]
    for i, m in enumerate(msgs):
        out[-1].append(m)
        nxt = msgs[i + 1] if i + 1 < len(msgs) else None
        if m.role in ("user", "tool") and (nxt is None or nxt.role != "tool"):
            out.append([])
    return [u for u in out if u]


def _messages(trace: str) -> list[Message]:
    """The messages a trace's hot loop replays: ``"seeded"``, the seeded tool-calling
    conversation; ``"cs"`` and ``"coding"``, the regimes of ``test_regimes.py`` (customer-service
    eval traffic behind a ~1,250-token policy prompt; a coding agent's long tool outputs),
    conversations stitched into one history, system prompt first; ``"cs-blocks"``, the
    customer-service one with every user message and tool result sent as one text block (as
    LangChain and Anthropic-style clients send them)."""
    if trace.endswith("-blocks"):
        return [m.model_copy(update={"content": [{"type": "text", "text": m.content}]})
                if m.role in ("user", "tool") and isinstance(m.content, str) and m.content else m
                for m in _messages(trace[:-len("-blocks")])]
    if trace.endswith("-reasoning"):  # every assistant message with its reasoning (see _reasoning)
        return [m.model_copy(update={"extra": {**m.extra, "reasoning_content": _reasoning(m, n)}})
                if m.role == "assistant" else m for n, m in enumerate(_messages(trace[:-len("-reasoning")]))]
    if trace == "seeded":
        return conversation(2_000)
    from test_regimes import history  # the [bench] extra (LangChain peers) imports there

    return history(trace)


def _tools_of(trace: str) -> list[dict]:
    """The request's tools in a trace's "tools" rows: the 7 schemas the seeded conversation
    calls; for the regimes, ``test_regimes.tool_schemas()`` (14 schemas, ~2k tokens)."""
    if trace == "seeded":
        return TOOLS
    from test_regimes import tool_schemas

    return tool_schemas()


def _split(size: int, family: str = "qwen3", trace: str = "seeded") -> tuple[list[Message], list[list[Message]]]:
    units = _units(_as_family_accepts(_messages(trace), family))
    n, k = 0, 0
    while n + sum(len(u) for u in units[k:k + TURNS]) < size:
        n += len(units[k])
        k += 1
    return [m for u in units[:k] for m in u], units[k:k + TURNS]


def _round(impl: str, size: int, path: str, family: str = "qwen3", engine: str = "auto", tools: bool = False,
           trace: str = "seeded"):
    """``(setup, target)``: setup warms a fresh counter on the history before the round;
    target replays the round's turns and returns the counts of the prompts sent. ``engine``
    is the counters' (for ``full_render``: "fastokens" tokenizes with fastokens, anything else
    with tokenizers, as transformers does). ``tools``: the requests carry ``TOOLS`` (budgeted
    by the filter, counted in the prompt's count, rendered by the full rendering); ``trace``:
    see ``_messages``."""
    before, turns = _split(size, family, trace)
    schemas = _tools_of(trace) if tools else None
    clock = time.perf_counter
    if impl == "transformers":  # the peer: apply_chat_template on the chat-completions dicts
        import transformers

        hf_tok = transformers.AutoTokenizer.from_pretrained(path)
        before_dicts = [message_to_template_dict(m) for m in before]
        turn_dicts = [[message_to_template_dict(m) for m in unit] for unit in turns]

        def tf_setup():
            gc.collect()  # then the warm-up, as ours (see the module docstring)
            history = list(before_dicts)
            hf_tok.apply_chat_template(history, tools=schemas, add_generation_prompt=True, tokenize=True,
                                       return_dict=False)
            return (hf_tok, None, history), {}

        def tf_target(tok, _flt, history, timed=False):
            out = []
            for unit in turn_dicts:
                t = clock()
                history.extend(unit)
                n = len(tok.apply_chat_template(history, tools=schemas, add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
                out.append(clock() - t if timed else n)
            return out
        return tf_setup, tf_target

    def setup():
        gc.collect()  # before the warm-up (see the module docstring: a collection evicts the caches)
        if impl == "hf":
            counter = HFTokenCounter(os.path.join(path, "tokenizer.json"), engine=engine)
        elif impl == "full_render":
            counter = ChatTemplateTokenCounter(path, engine="tokenizers")
        else:
            counter = ChatTemplateTokenCounter(path, engine=engine)
        flt = TokenBudgetFilter(BUDGETS[trace], counter=counter)
        history = list(before)
        kept = flt.apply(history, tools_schema=schemas)
        counter.count_messages(kept)
        flt.tools_cost(schemas, kept)
        return (counter, flt, history), {}

    if impl == "full_render":
        tok = _encodings.hf_fastokens(ChatTemplateTokenCounter(path, engine="tokenizers")._tok, "fastokens") \
            if engine == "fastokens" else None

        def target(counter, flt, history, timed=False):
            encode = (tok or counter._tok).encode
            out = []
            for unit in turns:
                t = clock()
                history.extend(unit)
                n = len(encode(counter.render(history, schemas), add_special_tokens=False))
                out.append(clock() - t if timed else n)
            return out
    else:
        def target(counter, flt, history, timed=False):
            out = []
            for unit in turns:
                t = clock()
                history.extend(unit)
                kept = flt.apply(history, tools_schema=schemas)
                n = counter.count_messages(kept) + flt.tools_cost(schemas, kept)
                out.append(clock() - t if timed else n)
            return out
    return setup, target


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", CASES, ids=[f"{t}-{n}" for t, n in CASES])
@pytest.mark.parametrize("impl", ["chat_template", "hf", "full_render", *PEERS])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("tools", [False, True], ids=["no_tools", "tools"])
def test_turn(benchmark, model_dirs, impl, case, family, engine, tools):
    trace, size = case
    if impl in PEERS and engine != "tokenizers":
        pytest.skip("transformers tokenizes with its own engine (measured once)")
    benchmark.group = (f"chat template hot loop ({family}), {_trace_name(trace)}{size} messages"
                       f"{', with tools' if tools else ''}, per {TURNS} turns")
    setup, target = _round(impl, size, model_dirs[family], family, engine, tools, trace)
    rounds = 3 if impl == "full_render" else 5
    benchmark.pedantic(target, setup=setup, rounds=rounds, iterations=1)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("tools", [False, True], ids=["no_tools", "tools"])
def test_counts_are_exact(model_dirs, family, engine, tools):
    """Before trusting the timings: every prompt counted in a round (with its tools) equals a
    full rendering of what the round kept, within the budget; the round kept what a fresh
    filter keeps (upper-bound charges too: DeepSeek-V3's, gpt-oss's); and transformers counts
    the same where nothing is trimmed."""
    model_dir = model_dirs[family]
    for trace, size in CASES:
        schemas = _tools_of(trace) if tools else None
        budget = BUDGETS[trace]
        setup, target = _round("chat_template", size, model_dir, family, engine, tools, trace)
        (counter, flt, history), _ = setup()
        assert counter.engine_in_use == engine
        before = len(history)
        counts = target(counter, flt, history)
        probe = ChatTemplateTokenCounter(model_dir, engine="tokenizers")
        (counter, flt, hist), _ = setup()  # the round again, keeping what each turn sends
        _, turns = _split(size, family, trace)
        for unit, n in zip(turns, counts):
            hist.extend(unit)
            kept = flt.apply(hist, tools_schema=schemas)
            assert n == probe.count_request(kept, schemas) <= budget
            assert kept == TokenBudgetFilter(budget, counter=probe).apply(hist, tools_schema=schemas)
        untrimmed = len(TokenBudgetFilter(budget, counter=probe).apply(history, tools_schema=schemas)) == len(history)
        assert untrimmed or (trace, size) != ("seeded", SIZES[0])  # the peer is checked at least there
        if PEERS and untrimmed:  # the peer counts the same prompts
            tf_setup, tf_target = _round("transformers", size, model_dir, family, engine, tools, trace)
            assert tf_target(*tf_setup()[0]) == counts
        assert before < len(history)


def _turn_mins(setup_target, rounds: int) -> list[float]:
    """Seconds of each turn of the round, each the least over ``rounds`` fresh replays (a
    shared machine preempts whole turns; the per-turn minimum sheds that)."""
    setup, target = setup_target
    mins: list[float] = []
    for _ in range(rounds):
        (counter, flt, history), _ = setup()
        times = target(counter, flt, history, timed=True)
        mins = times if not mins else [min(a, b) for a, b in zip(mins, times)]
    return mins


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("trace", ["seeded", "cs", "coding"])
@pytest.mark.parametrize("tools", [False, True], ids=["no_tools", "tools"])
def test_ratios(model_dirs, family, trace, tools, capsys):
    _report_ratios(model_dirs, family, trace, tools, capsys)


@pytest.mark.parametrize("family", ["qwen3", "llama3.1"])
def test_block_ratios(model_dirs, family, capsys):
    """The customer-service hot loop with user messages and tool results sent as content
    blocks, passed as given (transformers): Qwen3 prints nothing for a block list, Llama 3.1
    prints each block's text; either way a block's text is a frame's slot (assembled, not
    rendered: before session 21 every new block message rendered the template)."""
    _report_ratios(model_dirs, family, "cs-blocks", False, capsys)


@pytest.mark.parametrize("family", ["qwen3", "deepseek-v3", "gpt-oss"])
@pytest.mark.parametrize("trace", ["cs-reasoning", "coding-reasoning"])
def test_reasoning_ratios(model_dirs, family, trace, capsys):
    """The two regimes' hot loops with reasoning on every assistant message (what vLLM's
    reasoning parsers and DeepSeek's API return): Qwen3 prints it after the last user query
    (counted from segments since session 38: the units after it costed with no query after
    them), DeepSeek-V3 prints none of it (left out of the template dict since session 37),
    gpt-oss shows it while no final answer follows (its calls with reasoning rendered whole)."""
    _report_ratios(model_dirs, family, trace, False, capsys)


def _report_ratios(model_dirs, family, trace, tools, capsys):
    lines = []
    default = ChatTemplateTokenCounter(model_dirs[family]).engine_in_use  # what engine="auto" picks here
    for size in [n for t, n in CASES if t == _base_trace(trace)]:
        r = {}
        for engine in ENGINES:
            for impl in ("chat_template", "hf", "full_render"):
                r[(impl, engine)] = _round(impl, size, model_dirs[family], family, engine, tools, trace)
        for impl in PEERS:
            r[(impl, "tokenizers")] = _round(impl, size, model_dirs[family], family, "tokenizers", tools, trace)
        mins: dict[tuple[str, str], list[float]] = {}
        for k in range(ROUNDS):  # interleaved; whole renderings (seconds a round at 600) in 3 of them
            for key, st in r.items():
                if key[0] not in ("full_render", *PEERS) or k % 5 == 0:
                    got = _turn_mins(st, 1)
                    mins[key] = got if key not in mins else [min(a, b) for a, b in zip(mins[key], got)]
        t = {key: sum(v) / len(v) for key, v in mins.items()}
        ct, hf, full = t[("chat_template", default)], t[("hf", default)], t[("full_render", "tokenizers")]
        line = (f"chat template ({family}), {_trace_name(trace)}{size} messages{', with tools' if tools else ''}: per turn chat_template {ct * 1e6:.0f} us, "
                f"hf {hf * 1e6:.0f} us, full_render {full * 1e3:.2f} ms; "
                f"chat_template/hf = {ct / hf:.2f}, "
                f"full_render/chat_template = {full / ct:.0f}x  (defaults: engine auto = {default}; "
                "full_render tokenizes with tokenizers, as transformers does)")
        for engine in ENGINES:
            c, h = t[("chat_template", engine)], t[("hf", engine)]
            line += (f"\n    {engine}: chat_template {c * 1e6:.0f} us, hf {h * 1e6:.0f} us, chat_template/hf = "
                     f"{c / h:.2f}; full_render (tokenizers)/chat_template = {full / c:.0f}x")
        if PEERS:
            tf = t[("transformers", "tokenizers")]
            line += (f"\n    transformers' apply_chat_template {tf * 1e3:.2f} ms per turn: "
                     f"{tf / ct:.0f}x the default chat_template turn"
                     + "".join(f", {tf / t[('chat_template', e)]:.0f}x with {e}" for e in ENGINES))
        if "fastokens" in ENGINES:
            ff = t[("full_render", "fastokens")]
            line += (f"\n    full_render tokenized with fastokens {ff * 1e3:.2f} ms "
                     f"({ff / ct:.0f}x the default chat_template turn)")
        lines.append(line)
        REPORT.append(line)
    with capsys.disabled():
        print("\n" + "\n".join(lines))


# -- the eval regime: one counter behind many conversations ----------------------------------------

#: conversations replayed through one counter in ``test_eval_regime_ratios`` (the first few warm it)
EVAL_CONVERSATIONS = int(os.environ.get("JIANMU_FAST_CT_EVAL_CONVERSATIONS", "400"))
#: conversations a counter replays before the other takes its turn (test_eval_regime_ratios)
EVAL_CHUNK = 25


def _variant(m: Message, k: int) -> Message:
    """``m`` as conversation ``k`` has it: its text suffixed, its call ids its own (an eval
    run's conversations share their system prompt and tools, not their messages)."""
    upd: dict = {}
    if isinstance(m.content, str) and m.content and m.role != "system":
        upd["content"] = f"{m.content} #{k}"
    if m.tool_calls:
        upd["tool_calls"] = [{**c, "id": f"{c['id']}_{k}"} for c in m.tool_calls]
    if m.tool_call_id:
        upd["tool_call_id"] = f"{m.tool_call_id}_{k}"
    if isinstance(m.extra.get("reasoning_content"), str):
        upd["extra"] = {**m.extra, "reasoning_content": f"{m.extra['reasoning_content']}#{k}\n"}
    if not upd:
        return m
    return Message(**{**m.model_dump(exclude={"id", "metadata"}, exclude_none=True), **upd})


def _eval_round(counter, trace: str, family: str, convs) -> tuple[float, int]:
    """Seconds per turn of replaying ``convs`` through ``counter``, the collector left on: each
    conversation a fresh budget filter, its history trimmed and counted, then its turns -- all
    of it timed (a collection falls where the allocations cross its threshold, often in a
    conversation's first call: timing the turns alone measured where it fell, not what it
    cost); and how many full collections ran."""
    full = [0]

    def seen(phase, info):
        if phase == "start" and info["generation"] == 2:
            full[0] += 1

    n = sum(len(turns) for _, turns in convs)
    gc.callbacks.append(seen)
    try:
        t = time.perf_counter()
        for before, turns in convs:
            flt = TokenBudgetFilter(BUDGETS[trace], counter=counter)
            history = list(before)
            counter.count_messages(flt.apply(history))
            for unit in turns:
                history.extend(unit)
                kept = flt.apply(history)
                counter.count_messages(kept)
        total = time.perf_counter() - t
    finally:
        gc.callbacks.remove(seen)
    return total / n, full[0]


@pytest.mark.parametrize("family,trace", [(f, "cs") for f in ("qwen3", "mistral", "gpt-oss", "deepseek-v3")]
                         + [(f, "cs-reasoning") for f in ("qwen3", "deepseek-v3")])
def test_eval_regime_ratios(model_dirs, family, trace, capsys):
    """The customer-service regime as an eval run sends it: ``EVAL_CONVERSATIONS`` variants of
    its 24-message conversation (``_variant``) through one counter of each kind, each turn as in
    ``test_ratios`` (no tools), each conversation's first call included, the garbage collector
    on -- what the rounds above hide: they build a fresh counter each and collect before
    timing. The two counters take turns, ``EVAL_CHUNK`` conversations at a time, each on its
    own variants (session 39: timed one after the other, the ratio read 3.7x on a quiet machine
    where alternating read 2.4-2.7x -- the machine's speed drifts over a replay). Prints the
    time per turn of each counter (fastokens where installed) and their ratio, and the full
    collections during the replay. ``cs-reasoning``: every assistant message with its
    reasoning, each conversation's its own."""
    engine = "fastokens" if "fastokens" in ENGINES else "tokenizers"
    before, turns = _split(24, family, trace)
    path = model_dirs[family]
    counters = {"chat_template": ChatTemplateTokenCounter(path, engine=engine),
                "hf": HFTokenCounter(os.path.join(path, "tokenizer.json"), engine=engine)}
    convs = {impl: [([_variant(m, k) for m in before], [[_variant(m, k) for m in u] for u in turns])
                    for k in range(j * 100_000, j * 100_000 + EVAL_CONVERSATIONS)]
             for j, impl in enumerate(counters)}
    for impl, counter in counters.items():
        _eval_round(counter, trace, family, convs[impl][:3])  # (the counter's set-up, the templates' frames)
    gc.collect()
    spent = {impl: 0.0 for impl in counters}
    full = {impl: 0 for impl in counters}
    n = EVAL_CONVERSATIONS - 3
    for s in range(3, EVAL_CONVERSATIONS, EVAL_CHUNK):
        for impl, counter in counters.items():
            part = convs[impl][s:s + EVAL_CHUNK]
            per, f = _eval_round(counter, trace, family, part)
            spent[impl] += per * sum(len(u) for _, u in part)
            full[impl] += f
    turns_run = n * len(turns)
    ct, hf = spent["chat_template"] / turns_run, spent["hf"] / turns_run
    line = (f"chat template ({family}), eval regime: {n} customer-service conversations of 24 messages"
            f"{' with reasoning' if trace == 'cs-reasoning' else ''} "
            f"through one counter each ({engine}; the two alternate, {EVAL_CHUNK} conversations at a time): "
            f"per turn chat_template {ct * 1e6:.1f} us, hf {hf * 1e6:.1f} us, "
            f"chat_template/hf = {ct / hf:.2f} (each conversation's first call included); "
            f"full collections {full['chat_template']} / {full['hf']}")
    REPORT.append(line)
    with capsys.disabled():
        print("\n" + line)


STREAM_CONVERSATIONS = int(os.environ.get("JIANMU_FAST_CT_STREAM_CONVERSATIONS", "3000"))
STREAM_CHUNK = 250


@pytest.mark.parametrize("family", ["qwen3", "deepseek-v3"])
def test_eval_regime_streamed(model_dirs, family, capsys):
    """The eval regime as a long run streams it: ``STREAM_CONVERSATIONS`` customer-service
    conversations (``_variant``), ``STREAM_CHUNK`` at a time loaded (made) and then run through
    one counter of each kind (a fresh budget filter each, its first call and turns, the
    collector on: what ``test_eval_regime_ratios`` times), each chunk's loading untimed. Prints
    each counter's time per turn in the first and the last fifth of the run, their ratio, and
    what the template counter's caches hold at the end (message keys, their characters: bounded
    by ``MAX_KEY_CHARS``). Session 35: the caches grew until ``cache_size`` entries (~100 MB
    behind 4,000 conversations) and the turns slowed from ~2x to ~4x ``HFTokenCounter``'s."""
    engine = "fastokens" if "fastokens" in ENGINES else "tokenizers"
    before, turns = _split(24, family, "cs")
    path = model_dirs[family]
    counters = {"chat_template": ChatTemplateTokenCounter(path, engine=engine),
                "hf": HFTokenCounter(os.path.join(path, "tokenizer.json"), engine=engine)}
    warm = [([_variant(m, -k) for m in before], [[_variant(m, -k) for m in u] for u in turns]) for k in (1, 2, 3)]
    for counter in counters.values():
        _eval_round(counter, "cs", family, warm)  # (the counter's set-up, the templates' frames)
    per: dict = {impl: [] for impl in counters}
    for s in range(0, STREAM_CONVERSATIONS, STREAM_CHUNK):
        convs = [([_variant(m, k) for m in before], [[_variant(m, k) for m in u] for u in turns])
                 for k in range(s, s + STREAM_CHUNK)]
        for impl, counter in counters.items():
            per[impl].append(_eval_round(counter, "cs", family, convs)[0])
        del convs
    fifth = max(1, len(per["hf"]) // 5)
    first = {impl: sum(v[:fifth]) / fifth for impl, v in per.items()}
    last = {impl: sum(v[-fifth:]) / fifth for impl, v in per.items()}
    ct = counters["chat_template"]
    line = (f"chat template ({family}), eval regime streamed: {STREAM_CONVERSATIONS} conversations, {STREAM_CHUNK} "
            f"made at a time ({engine}): per turn chat_template {first['chat_template'] * 1e6:.1f} -> "
            f"{last['chat_template'] * 1e6:.1f} us, hf {first['hf'] * 1e6:.1f} -> {last['hf'] * 1e6:.1f} us (first -> "
            f"last fifth), chat_template/hf {first['chat_template'] / first['hf']:.2f} -> "
            f"{last['chat_template'] / last['hf']:.2f}; the counter's caches hold {len(ct._by_key)} message keys, "
            f"{ct._key_chars:,} characters (bound {ct.MAX_KEY_CHARS:,})")
    REPORT.append(line)
    with capsys.disabled():
        print("\n" + line)
    assert ct._key_chars <= ct.MAX_KEY_CHARS + max(map(len, ct._by_key))
