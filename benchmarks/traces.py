"""Seeded, realistic tool-calling conversations for benchmarks and example data.

A conversation is a list of chat-completions dicts:

- message 0 is a system prompt (the pinned prefix of the filters);
- then episodes: a user turn, zero or more tool rounds (an assistant message whose
  ``tool_calls`` hold 1 call, or 2-3 parallel calls, followed by one ``tool`` result per
  call, in call order), and a final assistant answer;
- tool arguments are realistic compact JSON; tool results are JSON, source code, logs,
  tables, Chinese prose and emoji, from tens of characters up to a few thousand (sizes
  drawn log-uniformly, so most are short and a few are long);
- ``make_conversation(n, seed)`` returns exactly ``n`` messages, ends on a complete unit
  (a user turn, a final answer, or a tool round with all its results), and is a pure
  function of ``(n, seed)``: the same arguments give the same list on every run and
  platform (only ``random.Random(seed)`` is used).

>>> conv = make_conversation(12, seed=1)
>>> len(conv), conv[0]["role"]
(12, 'system')
>>> conv == make_conversation(12, seed=1)
True
"""

from __future__ import annotations

import json
import random
from typing import Any, Callable

__all__ = ["SYSTEM_PROMPT", "make_conversation", "make_conversations", "check_history", "CS_SYSTEM_PROMPT",
           "make_cs_conversation", "make_cs_conversations", "make_cs_history", "stitch", "CODING_SYSTEM_PROMPT",
           "make_coding_conversation", "regime_stats"]

SYSTEM_PROMPT = (
    "You are Jianmu, a careful software and research assistant. Use the tools when they "
    "help: read files before editing them, run the tests after a change, and cite the "
    "source of every fact you look up. Answer in the user's language. Keep answers short; "
    "put code in fenced blocks."
)

_CITIES = ["Beijing", "Shanghai", "Hangzhou", "Shenzhen", "Chengdu", "Berlin", "Paris",
           "São Paulo", "Tokyo", "New York", "Nairobi", "Zürich"]
_CITIES_ZH = ["北京", "上海", "杭州", "深圳", "成都", "西安", "广州", "南京"]
_TOPICS = ["prompt caching", "tokenizer throughput", "SQLite WAL mode", "asyncio cancellation",
           "numpy strides", "Cython memoryviews", "Rust FFI", "vector databases",
           "HTTP/2 multiplexing", "JSON schema validation", "git rebase", "Kubernetes probes"]
_FILES = ["src/app/main.py", "src/app/models.py", "src/app/db/session.py", "tests/test_api.py",
          "jianmu_fast/memory/context/filters.py", "README.md", "pyproject.toml",
          "scripts/migrate.sql", "web/src/App.tsx", "docs/设计说明.md"]
_WORDS = ("the of and to in is that for it with as was on be by this are from or have an "
          "not but at which we can token prompt cache budget message tool call result "
          "history window filter context model request latency throughput index value "
          "error retry config deploy service cluster query table schema user agent").split()
_ZH = ("我们 需要 检查 这个 函数 的 返回值 以及 缓存 命中率 。 工具 调用 的 结果 显示 "
       "数据库 连接 超时 ， 请 稍后 重试 。 上下文 窗口 预算 已经 超出 限制 ， 所以 "
       "较早 的 消息 被 裁剪 。 天气 晴朗 ， 气温 适中 ， 适合 出行 。").split()
_EMOJI = ["✅", "❌", "⚠️", "🚀", "🔥", "📦", "🐛", "💡", "🙂", "🎉", "⏱️", "🌧️", "☀️"]
_LEVELS = ["INFO", "INFO", "INFO", "DEBUG", "WARNING", "ERROR"]


def _sentence(rng: random.Random, lo: int = 6, hi: int = 18) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]
    return " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"])


def _zh_sentence(rng: random.Random) -> str:
    return "".join(rng.choice(_ZH) for _ in range(rng.randint(6, 16))).rstrip("，。") + "。"


def _call_id(rng: random.Random) -> str:
    return "call_" + "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
                             for _ in range(24))


def _size(rng: random.Random, hi: int = 4000) -> int:
    """Result size in characters: log-uniform between 40 and ``hi`` (default 4000)."""
    return int(40 * (hi / 40) ** rng.random())


def _fill(rng: random.Random, target: int, line: Callable[[random.Random, int], str]) -> str:
    lines: list[str] = []
    total = 0
    i = 0
    while total < target:
        s = line(rng, i)
        lines.append(s)
        total += len(s) + 1
        i += 1
    return "\n".join(lines)


# -- tools: (name, arguments(rng) -> dict, result(rng, args, size) -> str) -----------------


def _weather_args(rng):
    if rng.random() < 0.3:
        return {"city": rng.choice(_CITIES_ZH), "unit": "celsius", "lang": "zh"}
    return {"city": rng.choice(_CITIES), "unit": rng.choice(["celsius", "fahrenheit"])}


def _weather_result(rng, args, size):
    days = [{"date": f"2026-11-{d:02d}", "high": rng.randint(-5, 35), "low": rng.randint(-15, 20),
             "precip_mm": round(rng.random() * 12, 1),
             "summary": rng.choice(["sunny ☀️", "rain 🌧️", "cloudy", "晴转多云", "小雨", "snow ❄️"])}
            for d in range(1, 2 + min(13, size // 120))]
    return json.dumps({"city": args["city"], "unit": args["unit"], "forecast": days}, ensure_ascii=False)


def _search_args(rng):
    q = rng.choice(_TOPICS) + " " + rng.choice(["benchmark", "best practices", "bug", "2026", "教程"])
    return {"query": q, "max_results": rng.choice([3, 5, 10])}


def _search_result(rng, args, size):
    hits = []
    n = max(1, min(args["max_results"], size // 200 + 1))
    for i in range(n):
        hits.append({"rank": i + 1, "title": _sentence(rng, 3, 8).rstrip(".?!"),
                     "url": f"https://example.org/{rng.choice(_TOPICS).replace(' ', '-')}/{rng.randint(100, 99999)}",
                     "snippet": " ".join(_sentence(rng) for _ in range(max(1, size // (n * 120))))})
    return json.dumps({"query": args["query"], "results": hits}, ensure_ascii=False)


def _read_args(rng):
    return {"path": rng.choice(_FILES), "start_line": 1, "end_line": rng.choice([40, 80, 200])}


def _code_line(rng, i):
    kind = i % 7
    name = rng.choice(["budget", "tokens", "window", "cache", "units", "prompt", "counts"])
    if kind == 0:
        return f"def {name}_{rng.randint(1, 99)}(messages: list[dict], limit: int = {rng.randint(1, 9) * 512}) -> int:"
    if kind == 1:
        return f'    """Return the {name} of the {rng.choice(_WORDS)} {rng.choice(_WORDS)}."""'
    if kind == 2:
        return f"    total = sum(len(m.get('content') or '') for m in messages[{rng.randint(0, 9)}:])"
    if kind == 3:
        return f"    if total > limit:  # {rng.choice(_WORDS)} {rng.choice(_WORDS)}"
    if kind == 4:
        return f"        raise ValueError(f\"{name} over limit: {{total}} > {{limit}}\")"
    if kind == 5:
        return f"    return total - {rng.randint(0, 64)}"
    return ""


def _read_result(rng, args, size):
    return _fill(rng, size, _code_line)


def _shell_args(rng):
    return {"command": rng.choice(["pytest -q tests/test_filters.py", "make test", "git log --oneline -n 20",
                                   "ls -la src/app", "python -m mypy jianmu_fast", "docker compose ps"]),
            "timeout_s": rng.choice([30, 120, 600])}


def _log_line(rng, i):
    ts = f"2026-11-30T0{rng.randint(0, 9)}:{rng.randint(10, 59)}:{rng.randint(10, 59)}.{rng.randint(100, 999)}Z"
    lvl = rng.choice(_LEVELS)
    extra = rng.choice(["", "", " " + rng.choice(_EMOJI), " 任务完成", " retry=" + str(rng.randint(1, 5))])
    return f"{ts} {lvl:<7} [{rng.choice(['worker', 'api', 'db', 'cache'])}-{rng.randint(1, 8)}] {_sentence(rng, 4, 12)}{extra}"


def _shell_result(rng, args, size):
    return _fill(rng, size, _log_line) + f"\n[exit code {rng.choice([0, 0, 0, 1, 2])}]"


def _sql_args(rng):
    table = rng.choice(["orders", "users", "events", "invoices"])
    return {"sql": f"SELECT id, status, amount, created_at FROM {table} WHERE amount > {rng.randint(10, 500)} "
                   f"ORDER BY created_at DESC LIMIT {rng.choice([5, 20, 50])}"}


def _sql_result(rng, args, size):
    rows = [{"id": rng.randint(1000, 999999), "status": rng.choice(["paid", "pending", "refunded", "已取消"]),
             "amount": round(rng.random() * 1000, 2), "created_at": f"2026-11-{rng.randint(1, 29):02d}"}
            for _ in range(max(1, size // 90))]
    return json.dumps({"columns": ["id", "status", "amount", "created_at"], "rows": rows}, ensure_ascii=False)


def _translate_args(rng):
    return {"text": _zh_sentence(rng), "source": "zh", "target": rng.choice(["en", "ja", "de"])}


def _translate_result(rng, args, size):
    return json.dumps({"translation": " ".join(_sentence(rng) for _ in range(max(1, size // 100))),
                       "detected_source": "zh", "confidence": round(0.8 + rng.random() * 0.2, 3)},
                      ensure_ascii=False)


def _notes_args(rng):
    return {"topic": rng.choice(_TOPICS), "lang": "zh"}


def _notes_result(rng, args, size):
    return _fill(rng, size, lambda r, i: f"{i + 1}. {_zh_sentence(r)} {r.choice(_EMOJI)}")


_TOOLS: list[tuple[str, Callable, Callable]] = [
    ("get_weather", _weather_args, _weather_result),
    ("search_web", _search_args, _search_result),
    ("read_file", _read_args, _read_result),
    ("run_shell", _shell_args, _shell_result),
    ("sql_query", _sql_args, _sql_result),
    ("translate", _translate_args, _translate_result),
    ("fetch_notes", _notes_args, _notes_result),
]


def _fn(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required}}}


def conversation_tools() -> list[dict[str, Any]]:
    """The request's ``tools`` for ``make_conversation``'s calls: one OpenAI function schema per
    tool it calls (~700 o200k tokens), as an agent sends them with every model call.

    >>> [t["function"]["name"] for t in conversation_tools()] == [name for name, _, _ in _TOOLS]
    True
    """
    s, i = {"type": "string"}, {"type": "integer"}
    return [
        _fn("get_weather", "Current weather and a short forecast for a city.",
            {"city": {**s, "description": "City name, in English or Chinese."},
             "unit": {**s, "enum": ["celsius", "fahrenheit"]}, "lang": {**s, "description": "Answer language."}},
            ["city"]),
        _fn("search_web", "Search the web; returns titles, URLs and snippets.",
            {"query": s, "max_results": {**i, "minimum": 1, "maximum": 20, "default": 5}}, ["query"]),
        _fn("read_file", "Read lines of a file in the workspace.",
            {"path": {**s, "description": "Path relative to the workspace root."},
             "start_line": {**i, "minimum": 1}, "end_line": {**i, "minimum": 1}}, ["path"]),
        _fn("run_shell", "Run a shell command in the workspace and return its output and exit code.",
            {"command": s, "timeout_s": {**i, "description": "Seconds before the command is killed.", "default": 120}},
            ["command"]),
        _fn("sql_query", "Run a read-only SQL query on the analytics database.",
            {"sql": {**s, "description": "One SELECT statement."}}, ["sql"]),
        _fn("translate", "Translate a text between languages.",
            {"text": s, "source": {**s, "description": "ISO 639-1 code."}, "target": {**s, "description": "ISO 639-1 code."}},
            ["text", "target"]),
        _fn("fetch_notes", "Fetch the user's saved notes on a topic.",
            {"topic": s, "lang": {**s, "enum": ["en", "zh"]}}, ["topic"]),
    ]


def _user_turn(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.25:
        return _zh_sentence(rng) + rng.choice(["", " 谢谢！", " 🙂"])
    if r < 0.35:
        return f"What's the weather in {rng.choice(_CITIES)} this week? And in {rng.choice(_CITIES)}?"
    if r < 0.5:
        return f"Please read {rng.choice(_FILES)} and fix the failing test. " + _sentence(rng)
    return " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))


def _answer(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.2:
        return "\n".join(_zh_sentence(rng) for _ in range(rng.randint(1, 4)))
    if r < 0.35:
        body = _fill(rng, rng.randint(80, 600), _code_line)
        return f"Here is the fix:\n\n```python\n{body}\n```\n{_sentence(rng)}"
    return " ".join(_sentence(rng) for _ in range(rng.randint(1, 6))) + rng.choice(["", " ✅", " 🎉"])


def _tool_round(rng: random.Random, n_calls: int, max_result_chars: int = 4000) -> list[dict[str, Any]]:
    calls, results = [], []
    for _ in range(n_calls):
        name, make_args, make_result = rng.choice(_TOOLS)
        args = make_args(rng)
        cid = _call_id(rng)
        calls.append({"id": cid, "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        results.append({"role": "tool", "tool_call_id": cid, "content": make_result(rng, args, _size(rng, max_result_chars))})
    preamble = rng.choice([None, None, None, "Let me check.", "I'll look that up.", "先查一下。"])
    return [{"role": "assistant", "content": preamble, "tool_calls": calls}, *results]


def make_conversation(n_messages: int, seed: int, *, max_result_chars: int = 4000) -> list[dict[str, Any]]:
    """Exactly ``n_messages`` chat-completions dicts, deterministic for ``seed``.

    Tool results are log-uniform in size between 40 and ``max_result_chars`` characters.

    >>> conv = make_conversation(40, seed=7)
    >>> len(conv), conv[0]["role"], check_history(conv)
    (40, 'system', True)
    >>> make_conversation(0, seed=7)
    []
    """
    if isinstance(n_messages, bool) or not isinstance(n_messages, int) or n_messages < 0:
        raise ValueError(f"n_messages must be a non-negative int, got {n_messages!r}")
    if max_result_chars < 40:
        raise ValueError(f"max_result_chars must be >= 40, got {max_result_chars!r}")
    rng = random.Random(seed)
    if n_messages == 0:
        return []
    out: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    state = "answered"  # what the last unit was: "answered" (or start), "user", "tools"
    rounds = 0
    while len(out) < n_messages:
        left = n_messages - len(out)
        if state == "answered":
            out.append({"role": "user", "content": _user_turn(rng)})
            state, rounds = "user", 0
            continue
        # after a user turn or a tool round: another tool round, or the final answer
        want_tools = left >= 2 and rng.random() < (0.75 if rounds == 0 else 0.55 / rounds)
        if want_tools:
            k = 1 if rng.random() < 0.6 else rng.choice([2, 3])
            k = min(k, left - 1)
            out.extend(_tool_round(rng, k, max_result_chars))
            state, rounds = "tools", rounds + 1
        else:
            out.append({"role": "assistant", "content": _answer(rng)})
            state = "answered"
    return out


def make_conversations(count: int, min_len: int, max_len: int, seed: int) -> list[list[dict[str, Any]]]:
    """``count`` conversations with lengths drawn uniformly from ``[min_len, max_len]``.

    >>> convs = make_conversations(3, 5, 9, seed=0)
    >>> [5 <= len(c) <= 9 for c in convs], convs == make_conversations(3, 5, 9, seed=0)
    ([True, True, True], True)
    """
    if not 0 <= min_len <= max_len:
        raise ValueError(f"need 0 <= min_len <= max_len, got {min_len}, {max_len}")
    rng = random.Random(seed)
    return [make_conversation(rng.randint(min_len, max_len), seed=rng.getrandbits(32)) for _ in range(count)]


def check_history(messages: list[Any]) -> bool:
    """True when every tool result answers a call of the assistant message before its run
    and every call is answered (dicts or Messages); raises AssertionError saying where not.

    >>> check_history([{"role": "tool", "tool_call_id": "x", "content": "r"}])
    Traceback (most recent call last):
    ...
    AssertionError: messages[0]: tool result 'x' answers no pending call
    """
    def get(m, k):
        return m.get(k) if isinstance(m, dict) else getattr(m, k)

    pending: list[str] = []
    for i, m in enumerate(messages):
        role = get(m, "role")
        if role == "tool":
            tcid = get(m, "tool_call_id")
            if tcid not in pending:
                raise AssertionError(f"messages[{i}]: tool result {tcid!r} answers no pending call")
            pending.remove(tcid)
            continue
        if pending:
            raise AssertionError(f"messages[{i}]: calls {pending} are unanswered")
        if role == "assistant" and get(m, "tool_calls"):
            pending = [c["id"] for c in get(m, "tool_calls")]
    if pending:
        raise AssertionError(f"end of history: calls {pending} are unanswered")
    return True


# == real-shaped regimes (issue 13) ============================================================
#
# Two regimes measured from real agent traffic, beside the synthetic traces above:
#
# - customer service (eval traffic of a gpt-4o tool-calling agent): one fixed policy system
#   prompt of ~1,250 o200k tokens, short conversations (24 messages median, p90 42, max 62)
#   that mostly fit a budget; assistant tool calls have ``content`` None and one call each,
#   the same ``tool_call_id`` is reused for every call of a conversation, tool results are
#   JSON records (~244 tokens median, p90 345, a rare one up to ~2,900);
# - coding agent: a short system prompt, ~150 messages and ~30k tokens per conversation,
#   tool outputs (files, diffs, test logs, grep hits) up to several thousand tokens.
#
# Sizes are drawn in tokens and written at ~4.3 characters per token (varied English words,
# identifiers and numbers): ``regime_stats`` measures the real o200k counts of a sample.

_CS_WORDS = (
    "order orders item items product products refund refunds exchange return returned payment "
    "method methods gift card credit paypal balance account user profile address shipping "
    "delivered pending processed cancelled cancel modify modification reservation flight "
    "flights cabin economy business basic passenger passengers baggage bags insurance "
    "membership gold silver regular compensation certificate voucher policy policies agent "
    "customer confirm confirmation explicit action database tool transfer human representative "
    "original price difference total charged authenticate identity email zip code name "
    "variant option options color size capacity material style brand warranty tracking "
    "number status date window hours days week month segment origin destination "
    "airport upgrade downgrade seat availability booking booked request requested "
    "please thanks sorry help would like could need want check able also only "
    "however before after within must should cannot unless then first next each any "
    "the a an and or of to in on for with by from at as is are was be this that it "
    "you your we our they their my me i his her"
).split()
_CS_NAMES = ["sara", "yusuf", "mei", "omar", "lucas", "aisha", "chen", "ivan", "noah", "fatima",
             "emma", "raj", "sofia", "liam", "yara", "mateo", "hana", "ethan", "zoe", "amir"]
_CS_SURNAMES = ["doe", "rossi", "kim", "garcia", "nguyen", "patel", "smith", "ito", "silva",
                "muller", "khan", "lopez", "wang", "brown", "sato", "novak", "ali", "jones"]
_CS_PRODUCTS = ["T-Shirt", "Running Shoes", "Backpack", "Water Bottle", "Desk Lamp", "Office Chair",
                "Mechanical Keyboard", "Wireless Earbuds", "Laptop", "Smart Watch", "Bookshelf",
                "Jigsaw Puzzle", "Hiking Boots", "Coffee Maker", "Air Purifier", "Tea Kettle",
                "Gaming Mouse", "Fleece Jacket", "Sunglasses", "Yoga Mat", "Skateboard", "Headphones"]
_CS_TOOLS = ["find_user_id_by_email", "find_user_id_by_name_zip", "get_user_details",
             "get_order_details", "get_product_details", "list_all_product_types",
             "cancel_pending_order", "modify_pending_order_items", "modify_pending_order_address",
             "modify_pending_order_payment", "return_delivered_order_items",
             "exchange_delivered_order_items", "modify_user_address", "transfer_to_human_agents"]
_CS_CITIES = ["Austin", "Denver", "Seattle", "Chicago", "Phoenix", "Columbus", "Charlotte",
              "San Diego", "Fort Worth", "Jacksonville", "Philadelphia", "Portland", "Boston"]


def _lognormal_int(rng: random.Random, median: float, p90: float, lo: int, hi: int) -> int:
    """A log-normal draw with the given median and 90th percentile, clipped to [lo, hi]."""
    import math

    sigma = math.log(p90 / median) / 1.2816
    return max(lo, min(hi, int(round(median * math.exp(rng.gauss(0.0, sigma))))))


def _cs_prose(rng: random.Random, tokens: int, dense: float = 0.0) -> str:
    """~``tokens`` o200k tokens of customer-service prose (varied words, names, numbers)."""
    out: list[str] = []
    n = 0
    while n < tokens:
        k = rng.randint(6, 20)
        words = [rng.choice(_CS_WORDS) for _ in range(k)]
        r = rng.random()
        cost = k + 1.0
        if r < 0.25:
            words.insert(rng.randrange(k), f"#W{rng.randint(1000000, 9999999)}")
            cost += 4
        elif r < 0.4:
            words.insert(rng.randrange(k), f"${rng.randint(5, 2999)}.{rng.randint(0, 99):02d}")
            cost += 4
        elif r < 0.5:
            words.insert(rng.randrange(k), rng.choice(_CS_PRODUCTS))
            cost += 2
        elif r < 0.5 + dense:
            words.insert(rng.randrange(k), f"`{rng.choice(_CS_TOOLS)}`")
            cost += 5
        out.append(" ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!", ","]))
        n += cost
    return " ".join(out)


def _cs_policy(seed: int = 13) -> str:
    """The fixed policy system prompt: ~6.2k characters, ~1,250 o200k tokens."""
    rng = random.Random(seed)
    parts = ["# Retail agent policy",
             "As a retail agent, you can help users cancel or modify pending orders, return or exchange "
             "delivered orders, modify their default user address, or provide information about their own "
             "profile, orders, and related products."]
    sections = ["Domain basic", "Authentication", "Cancel pending order", "Modify pending order",
                "Return delivered order", "Exchange delivered order", "Payment methods", "Transfers"]
    for title in sections:
        parts.append(f"\n## {title}\n")
        for _ in range(rng.randint(3, 5)):
            parts.append("- " + _cs_prose(rng, rng.randint(18, 34), dense=0.5) + f" (rule {rng.randint(1, 9)}.{rng.randint(1, 99)})")
        if len("\n".join(parts)) > 6_000:
            break
    text = "\n".join(parts)
    return text[:6_200].rsplit(" ", 1)[0] + "."


CS_SYSTEM_PROMPT = _cs_policy()


def _cs_user_id(rng: random.Random) -> str:
    return f"{rng.choice(_CS_NAMES)}_{rng.choice(_CS_SURNAMES)}_{rng.randint(1000, 9999)}"


def _cs_args(rng: random.Random, tool: str, user: str) -> str:
    """~16 tokens of compact JSON arguments."""
    if tool == "find_user_id_by_email":
        args: dict[str, Any] = {"email": f"{user.replace('_', '.')}@example.com"}
    elif tool == "find_user_id_by_name_zip":
        first, last, _ = user.split("_")
        args = {"first_name": first.capitalize(), "last_name": last.capitalize(), "zip": f"{rng.randint(10000, 99999)}"}
    elif tool in ("get_user_details", "modify_user_address"):
        args = {"user_id": user}
    elif tool == "get_product_details":
        args = {"product_id": f"{rng.randint(10 ** 9, 10 ** 10 - 1)}"}
    elif tool == "list_all_product_types":
        args = {}
    elif tool == "transfer_to_human_agents":
        args = {"summary": _cs_prose(rng, 12)}
    else:
        args = {"order_id": f"#W{rng.randint(1000000, 9999999)}"}
        if "items" in tool or "exchange" in tool or "return" in tool:
            args["item_ids"] = [f"{rng.randint(10 ** 9, 10 ** 10 - 1)}" for _ in range(rng.randint(1, 2))]
        if "payment" in tool or "return" in tool or "exchange" in tool:
            args["payment_method_id"] = rng.choice(["credit_card_", "gift_card_", "paypal_"]) + str(rng.randint(10 ** 6, 10 ** 7))
        if tool == "cancel_pending_order":
            args["reason"] = rng.choice(["no longer needed", "ordered by mistake"])
    return json.dumps(args)


def _cs_item(rng: random.Random) -> dict[str, Any]:
    return {"name": rng.choice(_CS_PRODUCTS), "product_id": f"{rng.randint(10 ** 9, 10 ** 10 - 1)}",
            "item_id": f"{rng.randint(10 ** 9, 10 ** 10 - 1)}", "price": round(rng.uniform(5, 3000), 2),
            "options": {"color": rng.choice(["black", "white", "red", "blue", "green", "grey"]),
                        "size": rng.choice(["S", "M", "L", "XL", "10", "11", "one size"]),
                        "material": rng.choice(["cotton", "polyester", "leather", "aluminum", "bamboo"])}}


def _cs_result(rng: random.Random, tool: str, user: str, tokens: int) -> str:
    """A JSON tool result of ~``tokens`` o200k tokens (nested records)."""
    if tool.startswith("find_user"):
        return user
    if tool == "transfer_to_human_agents":
        return "Transfer successful"
    first, last, _ = user.split("_")
    rec: dict[str, Any] = {
        "order_id": f"#W{rng.randint(1000000, 9999999)}", "user_id": user,
        "address": {"address1": f"{rng.randint(1, 999)} {rng.choice(_CS_SURNAMES).capitalize()} Street",
                    "address2": f"Suite {rng.randint(100, 999)}", "city": rng.choice(_CS_CITIES),
                    "country": "USA", "state": rng.choice(["TX", "CA", "NY", "WA", "IL", "OH"]),
                    "zip": f"{rng.randint(10000, 99999)}"},
        "items": [], "status": rng.choice(["pending", "delivered", "processed", "cancelled"]),
        "fulfillments": [], "payment_history": []}
    if tool == "get_user_details":
        rec = {"user_id": user, "name": {"first_name": first.capitalize(), "last_name": last.capitalize()},
               "address": rec["address"], "email": f"{first}.{last}{rng.randint(1, 99)}@example.com",
               "payment_methods": {}, "orders": []}
    size = len(json.dumps(rec))
    while size < tokens * 2.98:  # JSON with ids and prices: ~3 characters per o200k token
        if tool == "get_user_details":
            if rng.random() < 0.3:
                pid = rng.choice(["credit_card_", "gift_card_", "paypal_"]) + str(rng.randint(10 ** 6, 10 ** 7))
                rec["payment_methods"][pid] = {"source": pid.rsplit("_", 1)[0], "id": pid,
                                               "last_four": f"{rng.randint(1000, 9999)}"}
            else:
                rec["orders"].append(f"#W{rng.randint(1000000, 9999999)}")
        else:
            r = rng.random()
            if r < 0.6:
                part: Any = _cs_item(rng)
                rec["items"].append(part)
            elif r < 0.8:
                part = {"tracking_id": [f"{rng.randint(10 ** 11, 10 ** 12 - 1)}"],
                        "item_ids": [it["item_id"] for it in rec["items"][-2:]]}
                rec["fulfillments"].append(part)
            else:
                part = {"transaction_type": rng.choice(["payment", "refund"]), "amount": round(rng.uniform(5, 3000), 2),
                        "payment_method_id": "credit_card_" + str(rng.randint(10 ** 6, 10 ** 7))}
                rec["payment_history"].append(part)
            size += len(json.dumps(part)) + 2
            continue
        size = len(json.dumps(rec))
    return json.dumps(rec)


def make_cs_conversation(seed: int, n_messages: int | None = None) -> list[dict[str, Any]]:
    """A customer-service conversation (see the regime notes above), deterministic for ``seed``.

    Its length is drawn (24 median, p90 42, max 62) unless ``n_messages`` is given; it always
    ends on a complete unit, and is cut to at most ``n_messages`` messages.

    >>> conv = make_cs_conversation(3)
    >>> conv[0]["content"] == CS_SYSTEM_PROMPT, check_history(conv), conv == make_cs_conversation(3)
    (True, True, True)
    >>> calls = [m["tool_calls"][0]["id"] for m in conv if m.get("tool_calls")]
    >>> len(set(calls)) <= 1 and all(m["content"] is None for m in conv if m.get("tool_calls"))
    True
    """
    rng = random.Random(seed)
    want = n_messages if n_messages is not None else _lognormal_int(rng, 24, 42, 4, 62)
    user = _cs_user_id(rng)
    call_id = _call_id(rng)  # the same id for every call of the conversation
    out: list[dict[str, Any]] = [{"role": "system", "content": CS_SYSTEM_PROMPT}]
    while len(out) < want:
        left = want - len(out)
        out.append({"role": "user", "content": _cs_prose(rng, _lognormal_int(rng, 14, 34, 3, 200))})
        left -= 1
        while left >= 3 and rng.random() < 0.62:  # tool rounds before the answer
            tool = rng.choice(_CS_TOOLS)
            out.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": tool, "arguments": _cs_args(rng, tool, user)}}]})
            tokens = (_lognormal_int(rng, 235, 318, 20, 2_900) if rng.random() < 0.97
                      else int(800 * (2_900 / 800) ** rng.random()))
            out.append({"role": "tool", "tool_call_id": call_id, "content": _cs_result(rng, tool, user, tokens)})
            left -= 2
        if left >= 1:
            out.append({"role": "assistant", "content": _cs_prose(rng, _lognormal_int(rng, 45, 140, 5, 700))})
    return out


def make_cs_conversations(count: int, seed: int) -> list[list[dict[str, Any]]]:
    """``count`` customer-service conversations (independent seeds drawn from ``seed``).

    >>> len(make_cs_conversations(3, seed=1)), make_cs_conversations(2, 1) == make_cs_conversations(2, 1)
    (3, True)
    """
    rng = random.Random(seed)
    return [make_cs_conversation(rng.getrandbits(32)) for _ in range(count)]


def stitch(conversations: list[list[dict[str, Any]]], n_messages: int) -> list[dict[str, Any]]:
    """One history of exactly ``n_messages`` (or fewer if the input runs out, cut at a unit
    boundary): the first conversation whole, then the others without their system prompt,
    each cut short where the target is reached.

    >>> h = stitch(make_cs_conversations(40, seed=2), 600)
    >>> len(h), sum(m["role"] == "system" for m in h), check_history(h)
    (600, 1, True)
    """
    out: list[dict[str, Any]] = []
    for conv in conversations:
        for i, m in enumerate(conv if not out else conv[1:]):
            if len(out) >= n_messages:
                break
            if m.get("tool_calls") and len(out) + 2 > n_messages:
                break  # a call would be left without its result
            out.append(m)
        if len(out) >= n_messages:
            break
    return out


def make_cs_history(n_messages: int, seed: int) -> list[dict[str, Any]]:
    """Customer-service conversations stitched to a hot-loop history of ``n_messages``.

    >>> len(make_cs_history(100, seed=5)), make_cs_history(50, 5) == make_cs_history(50, 5)
    (100, True)
    """
    rng = random.Random(seed)
    convs: list[list[dict[str, Any]]] = []
    total = 0
    while total < n_messages + 80:
        convs.append(make_cs_conversation(rng.getrandbits(32)))
        total += len(convs[-1]) - 1
    return stitch(convs, n_messages)


# -- coding agent -----------------------------------------------------------------------------

CODING_SYSTEM_PROMPT = (
    "You are a coding agent working in the user's repository. Read files before you edit them, "
    "make small focused changes, run the tests after each change, and report what you changed."
)
_IDENT = ("user order cache token prompt window budget message request session config client "
          "handler parser reader writer batch record index value result error retry limit "
          "offset buffer stream queue worker task job state event schema table column row "
          "path file line chunk frame header payload count total size").split()
_CODE_TOOLS = ["read_file", "edit_file", "run_tests", "grep", "list_dir", "git_diff", "run_shell"]
_EXTS = ["py", "ts", "go", "rs", "sql", "md", "toml"]


def _ident(rng: random.Random) -> str:
    k = rng.randint(1, 3)
    return "_".join(rng.choice(_IDENT) for _ in range(k))


def _path(rng: random.Random) -> str:
    return "/".join([rng.choice(["src", "lib", "app", "pkg", "internal", "tests"]), _ident(rng), _ident(rng)]) \
        + "." + rng.choice(_EXTS)


def _py_line(rng: random.Random, i: int) -> str:
    a, b, c = _ident(rng), _ident(rng), _ident(rng)
    r = i % 9
    if r == 0:
        return f"def {a}({b}: {rng.choice(['int', 'str', 'list[dict]', 'Optional[bytes]'])}, {c}=None) -> {rng.choice(['int', 'bool', 'None', 'dict[str, Any]'])}:"
    if r == 1:
        return f'    """{_sentence(rng, 5, 14)}"""'
    if r == 2:
        return f"    {a} = {b}.get({c!r}, {rng.randint(0, 4096)})"
    if r == 3:
        return f"    if {a} is None or len({b}) > {rng.randint(1, 512)}:"
    if r == 4:
        return f"        raise ValueError(f\"{a}: {{{b}!r}} is {rng.choice(_WORDS)} {rng.choice(_WORDS)}\")"
    if r == 5:
        return f"    for {rng.choice('ijkn')}, {c} in enumerate({b}[{rng.randint(0, 9)}:]):"
    if r == 6:
        return f"        {a}[{c}] += {rng.randint(1, 64)}  # {_sentence(rng, 2, 6)}"
    if r == 7:
        return f"    return {a}"
    return ""


def _numbered(rng: random.Random, tokens: int) -> str:
    start = rng.randint(1, 400)
    body = _fill(rng, int(tokens * 3.6), _py_line).split("\n")
    return "\n".join(f"{start + j:>5}\t{line}" for j, line in enumerate(body))


def _diff(rng: random.Random, tokens: int) -> str:
    p = _path(rng)
    lines = [f"diff --git a/{p} b/{p}", f"index {rng.getrandbits(28):07x}..{rng.getrandbits(28):07x} 100644",
             f"--- a/{p}", f"+++ b/{p}"]
    n = 0
    while n < tokens * 3.6:
        lines.append(f"@@ -{rng.randint(1, 900)},{rng.randint(3, 12)} +{rng.randint(1, 900)},{rng.randint(3, 12)} @@")
        for j in range(rng.randint(3, 12)):
            line = rng.choice([" ", " ", "-", "+"]) + _py_line(rng, rng.randint(0, 8))
            lines.append(line)
            n += len(line) + 1
    return "\n".join(lines)


def _test_log(rng: random.Random, tokens: int) -> str:
    lines = [f"============================= test session starts ==============================",
             f"platform linux -- Python 3.11.{rng.randint(1, 9)}, pytest-8.{rng.randint(0, 3)}.{rng.randint(0, 5)}",
             f"collected {rng.randint(20, 900)} items", ""]
    n = 0
    while n < tokens * 3.8:
        r = rng.random()
        if r < 0.6:
            line = f"{_path(rng)}::test_{_ident(rng)} {rng.choice(['PASSED', 'PASSED', 'PASSED', 'FAILED', 'SKIPPED'])}"
        elif r < 0.8:
            line = f"E       AssertionError: assert {rng.randint(0, 999)} == {rng.randint(0, 999)}  # {_ident(rng)}"
        else:
            line = _log_line(rng, 0)
        lines.append(line)
        n += len(line) + 1
    lines.append(f"===== {rng.randint(0, 9)} failed, {rng.randint(10, 900)} passed in {rng.uniform(0.5, 90):.2f}s =====")
    return "\n".join(lines)


def _grep(rng: random.Random, tokens: int) -> str:
    lines = []
    n = 0
    while n < tokens * 3.8:
        line = f"{_path(rng)}:{rng.randint(1, 2000)}:{_py_line(rng, rng.randint(0, 8))}"
        lines.append(line)
        n += len(line) + 1
    return "\n".join(lines)


def _coding_args(rng: random.Random, tool: str) -> str:
    if tool == "read_file":
        args: dict[str, Any] = {"path": _path(rng), "offset": rng.randint(0, 400), "limit": rng.choice([80, 200, 400])}
    elif tool == "edit_file":
        args = {"path": _path(rng), "old": _py_line(rng, rng.randint(0, 8)), "new": _py_line(rng, rng.randint(0, 8))}
    elif tool == "run_tests":
        args = {"command": f"pytest -q {_path(rng)} -k {_ident(rng)}", "timeout": 600}
    elif tool == "grep":
        args = {"pattern": _ident(rng), "path": rng.choice(["src", "lib", "."]), "glob": "*." + rng.choice(_EXTS)}
    elif tool == "list_dir":
        args = {"path": _path(rng).rsplit("/", 1)[0]}
    elif tool == "git_diff":
        args = {"paths": [_path(rng) for _ in range(rng.randint(1, 3))]}
    else:
        args = {"command": rng.choice(["make build", "cargo check", "npm run lint", "go vet ./...", "ruff check ."])}
    return json.dumps(args)


def _coding_result(rng: random.Random, tool: str, tokens: int) -> str:
    if tool == "read_file":
        return _numbered(rng, tokens)
    if tool == "edit_file":
        return f"Edited {_path(rng)}: replaced 1 occurrence ({rng.randint(1, 40)} lines changed)."
    if tool in ("run_tests", "run_shell"):
        return _test_log(rng, tokens)
    if tool == "grep":
        return _grep(rng, tokens)
    if tool == "list_dir":
        return "\n".join(_path(rng).rsplit("/", 1)[1] for _ in range(max(2, tokens // 6)))
    return _diff(rng, tokens)


def make_coding_conversation(seed: int, n_messages: int = 150) -> list[dict[str, Any]]:
    """A coding-agent conversation of ``n_messages`` (default 150, ~30k o200k tokens):
    a short system prompt, a task, then tool rounds (one call or two parallel calls) with
    results from a few tokens to several thousand, occasional notes and user follow-ups.

    >>> conv = make_coding_conversation(1)
    >>> len(conv), conv[0]["content"] == CODING_SYSTEM_PROMPT, check_history(conv)
    (150, True, True)
    """
    rng = random.Random(seed)
    out: list[dict[str, Any]] = [{"role": "system", "content": CODING_SYSTEM_PROMPT},
                                 {"role": "user", "content": f"In {_path(rng)}, " + _sentence(rng, 10, 30)
                                  + " " + _sentence(rng, 8, 20)}]
    while len(out) < n_messages:
        left = n_messages - len(out)
        r = rng.random()
        if left >= 2 and r < 0.86:
            k = 1 if rng.random() < 0.85 or left < 3 else 2
            calls, results = [], []
            for _ in range(k):
                tool = rng.choice(_CODE_TOOLS)
                cid = _call_id(rng)
                calls.append({"id": cid, "type": "function", "function": {"name": tool, "arguments": _coding_args(rng, tool)}})
                tokens = int(30 * (4_000 / 30) ** (rng.random() ** 2.0))
                results.append({"role": "tool", "tool_call_id": cid, "content": _coding_result(rng, tool, tokens)})
            note = _sentence(rng, 6, 20) if rng.random() < 0.3 else None
            out.append({"role": "assistant", "content": note, "tool_calls": calls})
            out.extend(results)
        elif r < 0.95 or out[-1]["role"] == "user":
            out.append({"role": "assistant", "content": " ".join(_sentence(rng) for _ in range(rng.randint(1, 6)))})
        else:
            out.append({"role": "user", "content": _sentence(rng, 5, 25)})
    return out


def regime_stats(conversations: list[list[dict[str, Any]]], encode: Callable[[str], list[int]]) -> dict[str, float]:
    """Median / p90 / max of what the regimes are specified by, counted with ``encode``.

    >>> s = regime_stats([make_cs_conversation(1)], lambda t: t.split())
    >>> s["system_chars"] == len(CS_SYSTEM_PROMPT), s["args_median"] > 0
    (True, True)
    """
    def pct(xs: list[int], q: float) -> float:
        xs = sorted(xs)
        return float(xs[min(len(xs) - 1, int(q * len(xs)))]) if xs else 0.0

    lens = [len(c) for c in conversations]
    user = [len(encode(m["content"])) for c in conversations for m in c if m["role"] == "user"]
    text = [len(encode(m["content"])) for c in conversations for m in c
            if m["role"] == "assistant" and m["content"] and not m.get("tool_calls")]
    args = [len(encode(m["tool_calls"][0]["function"]["arguments"])) for c in conversations for m in c
            if m.get("tool_calls")]
    tool = [len(encode(m["content"])) for c in conversations for m in c if m["role"] == "tool"]
    conv_tokens = [sum(len(encode(m["content"] or "")) for m in c) for c in conversations]
    return {"system_tokens": len(encode(conversations[0][0]["content"])), "system_chars": len(conversations[0][0]["content"]),
            "msgs_median": pct(lens, .5), "msgs_p90": pct(lens, .9), "msgs_max": max(lens),
            "user_median": pct(user, .5), "assistant_text_median": pct(text, .5), "assistant_text_p90": pct(text, .9),
            "args_median": pct(args, .5), "tool_median": pct(tool, .5), "tool_p90": pct(tool, .9),
            "tool_max": max(tool), "conv_tokens_median": pct(conv_tokens, .5)}
