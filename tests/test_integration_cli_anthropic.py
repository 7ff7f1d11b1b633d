"""``jianmu-fast build --format anthropic``: Anthropic requests in, trimmed Anthropic requests out."""

from __future__ import annotations

import json

from anthropic.types import MessageParam
from pydantic import TypeAdapter

from jianmu_fast.cli import main

REQ = {
    "id": "conv-1",
    "system": "You are terse.",
    "messages": [
        {"role": "user", "content": "look up a"},
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."},
                                          {"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "a"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "A " * 600}]},
        {"role": "assistant", "content": "a is A."},
        {"role": "user", "content": [{"type": "text", "text": "and b?"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": "iVBORw0KGgo="}}]},
    ],
}


def run(tmp_path, lines, *flags):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    status = main(["build", str(src), "-o", str(dst), *flags])
    return status, [json.loads(x) for x in dst.read_text(encoding="utf-8").splitlines()]


def test_anthropic_in_and_out_untrimmed(tmp_path):
    status, out = run(tmp_path, [REQ], "--format", "anthropic")
    assert status == 0
    got = out[0]
    TypeAdapter(list[MessageParam]).validate_python(got["messages"])
    # the chat preset: persona first, then its history note, all in Anthropic's system field
    assert got["system"][0] == {"type": "text", "text": "You are terse."}
    assert got["system"][1]["text"].startswith("History semantics")
    assert [t["role"] for t in got["messages"]] == [t["role"] for t in REQ["messages"]]
    assert got["messages"][1]["content"][1] == REQ["messages"][1]["content"][1]  # the tool_use block
    assert got["messages"][1]["content"][0]["text"].endswith("Original message: Looking.")  # annotated
    assert got["messages"][2] == REQ["messages"][2] and got["messages"][3:] == REQ["messages"][3:]
    assert got["id"] == "conv-1" and got["dropped"]["messages"] == 0


def test_anthropic_trimmed_keeps_tool_use_with_result(tmp_path):
    status, out = run(tmp_path, [REQ, {"messages": REQ["messages"][:3]}], "--format", "anthropic",
                      "--max-tokens", "210", "--on-error", "skip")
    assert status == 0
    first = out[0]
    TypeAdapter(list[MessageParam]).validate_python(first["messages"])
    assert first["system"][0] == {"type": "text", "text": "You are terse."}  # the input's persona
    assert first["messages"] == REQ["messages"][3:]  # the tool round went whole
    assert first["dropped"]["messages"] == 3 and first["prompt_tokens"] <= 210
    assert len(out) == 1  # the second line's newest tool round cannot fit: reported, skipped


def test_openai_stays_the_default(tmp_path):
    status, out = run(tmp_path, [{"messages": [{"role": "user", "content": "hi"}]}])
    assert status == 0 and out[0]["messages"][-1] == {"role": "user", "content": "hi"}
    assert "system" not in out[0] and out[0]["messages"][0]["role"] == "system"  # chat-completions shape
