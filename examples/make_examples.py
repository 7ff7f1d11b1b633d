"""Write ``examples/conversations.jsonl``: 300 seeded, realistic tool-calling agent traces.

Run once from the repository root (the output is committed)::

    .venv/bin/python examples/make_examples.py

Each line is ``{"id": "conv-NNN", "messages": [...]}`` with chat-completions messages made by
``benchmarks/traces.py`` (a system prompt, user turns, parallel tool calls with JSON, code,
logs, Chinese and emoji results, final answers), 6 to 50 messages each. The same seed gives
the same file, byte for byte.
"""

from __future__ import annotations

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks"))

from traces import check_history, make_conversations  # noqa: E402

__all__ = ["main"]

COUNT, MIN_LEN, MAX_LEN, SEED = 300, 6, 50, 20261130


def main(path: pathlib.Path = HERE / "conversations.jsonl") -> int:
    convs = make_conversations(COUNT, MIN_LEN, MAX_LEN, seed=SEED)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for i, conv in enumerate(convs):
            check_history(conv)
            f.write(json.dumps({"id": f"conv-{i:03d}", "messages": conv}, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(convs)} conversations, {path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
