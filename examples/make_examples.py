"""Write ``examples/conversations.jsonl``: 300 seeded, realistic tool-calling agent traces.

Run once from the repository root (the output is committed)::

    .venv/bin/python examples/make_examples.py

Each line is ``{"id": "conv-NNN", "messages": [...]}`` with chat-completions messages made by
``benchmarks/traces.py`` (a system prompt, user turns, parallel tool calls with JSON, code,
logs, Chinese and emoji results, final answers), 6 to 50 messages drawn, then cut to end
where a model is called: the trailing final answers are removed, so the last message is a
user turn or a tool result (``ends_at_a_call``). The same seed gives the same file, byte for byte.
"""

from __future__ import annotations

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks"))

from traces import check_history, make_conversations  # noqa: E402

__all__ = ["main", "ends_at_a_call"]

COUNT, MIN_LEN, MAX_LEN, SEED = 300, 6, 50, 20261130


def ends_at_a_call(conv: list[dict]) -> list[dict]:
    """``conv`` without its trailing assistant answers: it ends on a user turn or a tool result,
    where a model would be called next.

    >>> [m["role"] for m in ends_at_a_call([{"role": "user"}, {"role": "assistant"}])]
    ['user']
    """
    end = len(conv)
    while end and conv[end - 1]["role"] == "assistant":
        end -= 1
    return conv[:end]


def main(path: pathlib.Path = HERE / "conversations.jsonl") -> int:
    convs = [ends_at_a_call(c) for c in make_conversations(COUNT, MIN_LEN, MAX_LEN, seed=SEED)]
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for i, conv in enumerate(convs):
            check_history(conv)
            f.write(json.dumps({"id": f"conv-{i:03d}", "messages": conv}, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(convs)} conversations, {path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
