"""``OpenAIChatClient`` against a real chat-completions server on 127.0.0.1, through the real
``openai`` package: requests as sent, replies as read, retries, timeouts and typed errors."""

from __future__ import annotations

import asyncio
import json
import pickle
import socket
import subprocess
import sys
import time

import pytest

from jianmu_fast.errors import JianmuError, ModelCallError
from jianmu_fast.message import Message, ai, human, system, tool
from jianmu_fast.model import ModelClient, OpenAIChatClient, check_tool_calls
from jianmu_fast.testing import ChatCompletionsServer, Reply, tool_call

CALC = {"type": "function", "function": {"name": "calc", "description": "Arithmetic.",
                                         "parameters": {"type": "object", "properties": {"expr": {"type": "string"}},
                                                        "required": ["expr"]}}}


@pytest.fixture
def server():
    with ChatCompletionsServer() as s:
        yield s


def client_for(server, **kw):
    kw.setdefault("backoff", 0.01)
    return OpenAIChatClient("test-model", base_url=server.base_url, api_key="k", **kw)


def test_text_reply_and_the_request_as_sent(server):
    server.add("The answer is 4.")
    history = [system("Be terse."), human("What is 2+2?")]
    with client_for(server) as c:
        reply = c.invoke(history, tools=[CALC], config={"temperature": 0, "top_k": 5, "model": "other"})
    assert isinstance(reply, Message) and reply.role == "assistant" and reply.content == "The answer is 4."
    assert reply.tool_calls is None
    (req,) = server.requests
    assert req["messages"] == [m.to_openai() for m in history]
    assert req["tools"] == [CALC]
    assert req["temperature"] == 0 and req["top_k"] == 5  # top_k: not a create() parameter, sent in the body
    assert req["model"] == "other"
    assert reply.metadata["model"] == "other" and reply.metadata["response_id"] == "chatcmpl-1"
    assert reply.metadata["finish_reason"] == "stop"


def test_usage_figures_are_kept_as_sent(server):
    usage = {"prompt_tokens": 17, "completion_tokens": 3, "total_tokens": 20,
             "prompt_tokens_details": {"cached_tokens": 8}}
    server.add(Reply("ok", usage=usage))
    with client_for(server) as c:
        assert c.invoke([human("hi")]).metadata["usage"] == usage


def test_tool_call_reply(server):
    server.add({"content": None, "tool_calls": [tool_call("calc", {"expr": "2+2"}, "call_1"),
                                                tool_call("calc", "", "call_2")]})
    with client_for(server) as c:
        reply = c.invoke([human("2+2 and nothing?")], tools=[CALC])
    assert reply.content is None
    assert reply.tool_calls == [
        {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+2"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "calc", "arguments": ""}},
    ]
    assert reply.metadata["finish_reason"] == "tool_calls"
    # the reply goes back to the API unchanged in the next request
    assert Message.from_openai(reply.to_openai()).tool_calls == reply.tool_calls


def test_dict_messages_are_accepted(server):
    server.add("ok")
    with client_for(server) as c:
        c.invoke([{"role": "user", "content": "hi", "name": "ada"}])
    assert server.requests[0]["messages"] == [{"role": "user", "content": "hi", "name": "ada"}]


@pytest.mark.parametrize("status", [500, 502, 503, 429, 408])
def test_retryable_status_then_success(server, status):
    server.add(Reply(status=status, body={"error": {"message": "busy"}}), "fine")
    with client_for(server, max_retries=2) as c:
        reply = c.invoke([human("hi")])
    assert reply.content == "fine"
    assert len(server.requests) == 2 and server.requests[0] == server.requests[1]


def test_retry_after_header_is_honoured_and_capped(server):
    server.add(Reply(status=429, body="slow down", headers={"retry-after-ms": "150"}), "ok")
    with client_for(server, backoff=0.0) as c:
        t0 = time.monotonic()
        c.invoke([human("hi")])
        waited = time.monotonic() - t0
    assert waited >= 0.15
    server.add(Reply(status=429, body="slow down", headers={"retry-after": "30"}), "ok")
    with client_for(server, max_backoff=0.05) as c:
        t0 = time.monotonic()
        c.invoke([human("hi")])
        assert time.monotonic() - t0 < 5  # 30 s asked, capped at max_backoff


def test_retries_exhausted_raises_with_status_and_body(server):
    server.add(*[Reply(status=429, body={"error": {"message": "rate limited, try later"}})] * 3)
    with client_for(server, max_retries=2) as c:
        with pytest.raises(ModelCallError) as ei:
            c.invoke([human("hi")])
    err = ei.value
    assert err.status == 429 and err.attempts == 3 and "rate limited, try later" in err.body
    assert "HTTP 429 after 3 attempt(s)" in str(err) and "test-model" in str(err)
    assert len(server.requests) == 3
    assert isinstance(err, JianmuError) and isinstance(err, RuntimeError)


def test_client_errors_are_not_retried(server):
    server.add(Reply(status=400, body={"error": {"message": "context too long"}}), "never sent")
    with client_for(server, max_retries=5) as c:
        with pytest.raises(ModelCallError, match="HTTP 400 after 1 attempt") as ei:
            c.invoke([human("hi")])
    assert ei.value.status == 400 and "context too long" in ei.value.body
    assert len(server.requests) == 1 and list(server.script) == ["never sent"]


def test_body_excerpt_is_bounded(server):
    server.add(Reply(status=500, body="x" * 5000))
    with client_for(server, max_retries=0) as c:
        with pytest.raises(ModelCallError) as ei:
            c.invoke([human("hi")])
    assert ei.value.body == "x" * 500 + "..."


def test_timeout_then_success_and_timeout_exhausted(server):
    server.add(Reply("late", delay=1.0), "on time")
    with client_for(server, timeout=0.2, max_retries=1) as c:
        assert c.invoke([human("hi")]).content == "on time"
    assert len(server.requests) == 2
    server.add(Reply("late", delay=1.0), Reply("late", delay=1.0))
    with client_for(server, timeout=0.2, max_retries=1) as c:
        with pytest.raises(ModelCallError, match=r"timed out \(timeout=0.2s\) after 2 attempt") as ei:
            c.invoke([human("hi")])
    assert ei.value.status is None and ei.value.attempts == 2


def test_connection_refused_names_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = OpenAIChatClient("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=1, backoff=0.0)
    with pytest.raises(ModelCallError, match=f"127.0.0.1:{port}/v1/chat/completions.*could not connect after 2"):
        c.invoke([human("hi")])
    c.close()


@pytest.mark.parametrize("calls, match", [
    ([tool_call("calc", '{"expr": "2+2"', "a")], r"tool_calls\[0\].function.arguments is not JSON"),
    ([tool_call("calc", {"expr": "1"}, "a"), tool_call("calc", {"expr": "2"})], r"tool_calls\[1\].id: missing"),
    ([tool_call("calc", "[1, 2]", "a")], r"tool_calls\[0\].function.arguments must be a JSON object"),
    ([tool_call("calc", "{}", "a"), tool_call("calc", "{}", "a")], r"tool_calls\[1\].id: 'a' is used twice"),
    ([{"id": "a", "type": "function", "function": {"arguments": "{}"}}], r"tool_calls\[0\].function.name: missing"),
    ([tool_call("calc", "{}", "")], r"tool_calls\[0\].id: ''"),
])
def test_malformed_tool_calls_raise(server, calls, match):
    server.add({"content": None, "tool_calls": calls})
    with client_for(server) as c:
        with pytest.raises(ModelCallError, match=match) as ei:
            c.invoke([human("hi")], tools=[CALC])
    assert ei.value.status == 200 and len(server.requests) == 1  # not retried


@pytest.mark.parametrize("body, match", [
    ("<html>gateway</html>", "not JSON"),
    ({"id": "x", "choices": []}, "no choices"),
    ({"choices": [{"index": 0}]}, r"choices\[0\].message is missing"),
])
def test_replies_that_are_not_completions(server, body, match):
    server.add(Reply(body=body))
    with client_for(server) as c:
        with pytest.raises(ModelCallError, match=match):
            c.invoke([human("hi")])


def test_ainvoke_matches_invoke(server):
    server.add(Reply(status=503, body="down"), {"content": None, "tool_calls": [tool_call("calc", {"expr": "3"}, "c9")]},
               Reply(status=429, body="no"), Reply(status=429, body="no"))
    c = client_for(server, max_retries=1)

    async def main():
        first = await c.ainvoke([human("3?")], tools=[CALC])
        with pytest.raises(ModelCallError) as ei:
            await c.ainvoke([human("3?")])
        return first, ei.value

    first, err = asyncio.run(main())
    assert first.tool_calls[0]["id"] == "c9" and err.status == 429 and err.attempts == 2
    assert len(server.requests) == 4
    c.close()


def test_config_cannot_override_what_the_client_sets(server):
    with client_for(server) as c:
        with pytest.raises(ValueError, match=r"config\['stream'\].*streaming is not supported"):
            c.invoke([human("hi")], config={"stream": True})
        with pytest.raises(ValueError, match=r"config\['messages'\]"):
            c.invoke([human("hi")], config={"messages": []})
    assert server.requests == []


def test_constructor_checks(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="api_key: no key given and OPENAI_API_KEY is not set"):
        OpenAIChatClient("m")
    with pytest.raises(ValueError, match="timeout"):
        OpenAIChatClient("m", base_url="http://127.0.0.1:1/v1", timeout=0)
    with pytest.raises(ValueError, match="max_retries"):
        OpenAIChatClient("m", base_url="http://127.0.0.1:1/v1", max_retries=-1)
    c = OpenAIChatClient("m", base_url="http://127.0.0.1:1/v1")  # local endpoint: no key needed
    assert isinstance(c, ModelClient) and repr(c) == "OpenAIChatClient('m', base_url='http://127.0.0.1:1/v1')"
    c.close()


def test_check_tool_calls_on_any_message():
    good = ai(None, tool_calls=[tool_call("f", {"a": 1}, "c1")])
    assert check_tool_calls(good) is good
    assert check_tool_calls(human("hi")).content == "hi"
    with pytest.raises(ModelCallError, match=r"step\.tool_calls\[0\]\.id: missing"):
        check_tool_calls(ai(None, tool_calls=[tool_call("f", "{}")]), "step")
    assert check_tool_calls(tool("4", tool_call_id="c1")).role == "tool"


def test_model_call_error_pickles_with_its_fields():
    err = pickle.loads(pickle.dumps(ModelCallError("boom", status=503, body="down", attempts=3)))
    assert (str(err), err.status, err.body, err.attempts) == ("boom", 503, "down", 3)


def test_importing_jianmu_fast_does_not_import_openai():
    code = ("import sys, jianmu_fast, jianmu_fast.model, jianmu_fast.nodes, jianmu_fast.testing, "
            "jianmu_fast.memory.context; bad = [m for m in ('openai', 'httpx') if m in sys.modules]; "
            "print(json.dumps(bad))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
