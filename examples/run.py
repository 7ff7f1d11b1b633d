"""Build prompts for the bundled example conversations and report tokens kept and dropped."""

import json
import pathlib
import sys

import jianmu_fast
from jianmu_fast.memory.context import (
    ContextBuilder,
    MaxMessagesFilter,
    SimpleTokenCounter,
    StaticPromptProvider,
    TokenBudgetFilter,
)
from jianmu_fast.message import coerce_messages


class _History:
    def get_messages(self, local_state, global_state=None, ctx=None):
        return local_state["messages"]


def main(path: str) -> int:
    counter = SimpleTokenCounter()
    builder = ContextBuilder(
        providers=[StaticPromptProvider("You are a helpful agent."), _History()],
        filters=[MaxMessagesFilter(max_messages=40), TokenBudgetFilter(800, counter=counter)],
    )
    print(f"backend: {jianmu_fast.BACKEND}")
    print(f"{'conversation':>12} {'messages':>8} {'kept':>5} {'tokens in':>9} {'kept':>6} {'dropped':>7}")
    for i, line in enumerate(pathlib.Path(path).read_text().splitlines()):
        history = coerce_messages(json.loads(line)["messages"], f"line {i + 1}: messages")
        prompt = builder.build({"messages": history})
        full = counter.count_messages(builder.providers[0].get_messages({}) + history)
        kept = counter.count_messages(prompt)
        print(f"{i:>12} {len(history):>8} {len(prompt):>5} {full:>9} {kept:>6} {full - kept:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(pathlib.Path(__file__).with_name("conversations.jsonl"))))
