"""Round trips of the 300 bundled agent traces (examples/conversations.jsonl) through every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from anthropic.types import MessageParam
from openai.types.responses import ResponseInputItemParam
from pydantic import TypeAdapter

from jianmu_fast.integrations.anthropic import from_anthropic, to_anthropic
from jianmu_fast.integrations.langchain import from_langchain, to_langchain
from jianmu_fast.integrations.openai_responses import from_responses, to_responses
from jianmu_fast.message import coerce_messages

TRACES = Path(__file__).resolve().parent.parent / "examples" / "conversations.jsonl"


@pytest.fixture(scope="module")
def traces():
    with TRACES.open(encoding="utf-8") as f:
        return [coerce_messages(json.loads(line)["messages"]) for line in f]


def _json_args(ds):
    for d in ds:
        for c in d.get("tool_calls") or ():
            c["function"] = {**c["function"], "arguments": json.loads(c["function"]["arguments"])}
    return ds


def test_langchain_round_trip_of_real_traces(traces):
    assert len(traces) == 300
    for ms in traces:
        lcs = to_langchain(ms)
        assert from_langchain(lcs) == ms
        assert to_langchain(from_langchain(lcs)) == lcs


def test_responses_round_trip_of_real_traces(traces):
    adapter = TypeAdapter(list[ResponseInputItemParam])
    for ms in traces:
        items = to_responses(ms)
        adapter.validate_python(items)
        back = from_responses(items)
        assert [m.to_openai() for m in back] == [m.to_openai() for m in ms]
        assert to_responses(back) == items


def test_anthropic_round_trip_of_real_traces(traces):
    adapter = TypeAdapter(list[MessageParam])
    for ms in traces:
        req = to_anthropic(ms)
        adapter.validate_python(req["messages"])
        back = from_anthropic(req["messages"], req.get("system"))
        assert _json_args([m.to_openai() for m in back]) == _json_args([m.to_openai() for m in ms])
        assert to_anthropic(back) == req
