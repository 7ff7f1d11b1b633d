"""The design document's examples, run unchanged with ``jianmu`` renamed ``jianmu_fast``.

Each snippet is the document's code, verbatim apart from the rename, executed as a script;
the asserts check the output the document shows in its comments. (The preset, skill and
history examples are tested beside their features.)
"""

from __future__ import annotations

import textwrap


def run(snippet: str) -> dict:
    namespace: dict = {}
    exec(compile(textwrap.dedent(snippet), "<design-doc>", "exec"), namespace)
    return namespace


def test_factories():
    ns = run('''
        # 轻量工厂函数
        from jianmu_fast.message import system, human, ai, tool

        a = system("You are a helpful assistant.")   # role="system"
        b = human("What is 2+2?")                    # role="user"
        c = ai("The answer is 4.")                   # role="assistant"
        d = tool('{"result": 4}', name="calculator") # role="tool"
    ''')
    assert [ns[k].role for k in "abcd"] == ["system", "user", "assistant", "tool"]
    assert ns["d"].name == "calculator" and ns["d"].content == '{"result": 4}'


def test_static_prompt_provider():
    ns = run('''
        from jianmu_fast.memory.context import StaticPromptProvider
        provider = StaticPromptProvider("You are a helpful assistant.")
        # → [system("You are a helpful assistant.")]
    ''')
    out = ns["provider"].get_messages({})
    assert [(m.role, m.content) for m in out] == [("system", "You are a helpful assistant.")]


def test_tools_desc_provider():
    ns = run('''
        from jianmu_fast.memory.context import ToolsDescProvider
        provider = ToolsDescProvider("- calculator: perform arithmetic\\n- search: web search")
        # → [system("Available tools:\\n- calculator: perform arithmetic\\n- search: web search")]
    ''')
    out = ns["provider"].get_messages({})
    assert [(m.role, m.content) for m in out] == [
        ("system", "Available tools:\n- calculator: perform arithmetic\n- search: web search")
    ]


def test_max_messages_filter():
    ns = run('''
        from jianmu_fast.memory.context import MaxMessagesFilter

        f = MaxMessagesFilter(max_messages=5, pinned_roles=("system",))
        # 输入: [sys1, sys2, u1, a1, u2, a2, u3, a3]
        # 输出: [sys1, sys2, a1, u2, a2, u3, a3]  # 钉住前2条 + 最近3条
    ''')
    from jianmu_fast.message import ai, human, system

    msgs = [system("sys1"), system("sys2"), human("u1"), ai("a1"), human("u2"), ai("a2"), human("u3"), ai("a3")]
    out = ns["f"].apply(msgs)
    assert [m.content for m in out] == ["sys1", "sys2", "a1", "u2", "a2", "u3", "a3"]


def test_custom_provider_and_filter_compose():
    ns = run('''
        from jianmu_fast.memory.context.base import MessageProvider
        from jianmu_fast.message import Message, system
        from datetime import datetime

        class TimestampProvider:
            def get_messages(self, local_state, global_state=None, ctx=None):
                ts = datetime.now().isoformat()
                return [system(f"Current time: {ts}")]

        class DeduplicateFilter:
            def apply(self, messages, local_state=None, global_state=None, ctx=None, **kwargs):
                result = []
                for msg in messages:
                    if result and msg.role == "user" and result[-1].role == "user":
                        if msg.content == result[-1].content:
                            continue
                    result.append(msg)
                return result
    ''')
    from jianmu_fast.memory.context import ContextBuilder, MessageProvider
    from jianmu_fast.message import human

    class History:
        def get_messages(self, local_state, global_state=None, ctx=None):
            return local_state["messages"]

    provider = ns["TimestampProvider"]()
    assert isinstance(provider, MessageProvider)
    builder = ContextBuilder(providers=[provider, History()], filters=[ns["DeduplicateFilter"]()])
    out = builder.build({"messages": [human("hi"), human("hi"), human("there")]})
    assert out[0].role == "system" and out[0].content.startswith("Current time: ")
    assert [m.content for m in out[1:]] == ["hi", "there"]
