"""The Python side of ``make run``: build every example conversation with ``build_batch``.

``make run`` calls the command line (``jianmu-fast build examples/conversations.jsonl ...``);
this script does the same through the API and prints one row per conversation. As on the
command line, each conversation's own system message is the persona (``InputPersonaProvider``):
a prompt never carries two::

    .venv/bin/python examples/run.py [examples/conversations.jsonl]
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import jianmu_fast
from jianmu_fast.batch import build_batch_report
from jianmu_fast.cli import InputPersonaProvider, split_persona
from jianmu_fast.memory.context import ContextBuilder, TiktokenTokenCounter
from jianmu_fast.message import coerce_messages

HERE = pathlib.Path(__file__).resolve().parent


def main(path: str) -> int:
    counter = TiktokenTokenCounter("o200k_base")
    preset = ContextBuilder.for_react(
        tools_desc=(HERE / "tools_desc.txt").read_text(encoding="utf-8"),
        max_tokens=4000,
        token_counter=counter,
    )
    builder = ContextBuilder(providers=[InputPersonaProvider(preset.providers[0]), *preset.providers[1:]],
                             filters=preset.filters)
    lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
    histories = [coerce_messages(json.loads(line)["messages"], f"line {i + 1}: messages") for i, line in enumerate(lines)]
    t0 = time.perf_counter()
    states = []
    for h in histories:
        persona, rest = split_persona(h)
        states.append({"messages": rest, "persona": persona})
    report = build_batch_report(builder, states)
    seconds = time.perf_counter() - t0
    print(f"backend {jianmu_fast.BACKEND}: {len(histories)} prompts in {seconds * 1000:.0f} ms")
    print(f"{'line':>5} {'messages':>8} {'kept':>5} {'tokens':>7}")
    for i, (history, prompt) in enumerate(zip(histories, report.prompts)):
        if prompt is None:
            continue
        if i < 10 or i == len(histories) - 1:
            print(f"{i + 1:>5} {len(history):>8} {len(prompt):>5} {counter.count_messages(prompt):>7}")
    for f in report.failures:
        print(f"line {f.index + 1}: {f.reason}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(HERE / "conversations.jsonl")))
