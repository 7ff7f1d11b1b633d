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

__all__ = ["SYSTEM_PROMPT", "make_conversation", "make_conversations", "check_history"]

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
