"""Presets: the design document's examples, provider chains, runtime consumption, filters."""

from __future__ import annotations

import json

import pytest

from jianmu_fast.config import clear_config_cache, prompts
from jianmu_fast.errors import ConfigError
from jianmu_fast.memory.context import (
    BootstrapFilesProvider,
    ContextBuilder,
    MaxMessagesFilter,
    PromptRuntimeContext,
    RunContext,
    SkillSetPromptProvider,
    StaticPromptProvider,
    TiktokenTokenCounter,
    TokenBudgetFilter,
    ToolsDescProvider,
)
from jianmu_fast.memory.context.providers.state_history import StateHistoryProvider
from jianmu_fast.message import ai, human
from jianmu_fast.skills import Skill, SkillsCatalog

S, B, T, K, H = "StaticPromptProvider", "BootstrapFilesProvider", "ToolsDescProvider", "SkillSetPromptProvider", "StateHistoryProvider"


pytestmark = pytest.mark.usefixtures("config_sandbox_subdir")


def chain(builder):
    return [type(p).__name__ for p in builder.providers]


def filters(builder):
    return [type(f).__name__ for f in builder.filters]


def make_skills(root, *names, always=()):
    for n in names:
        (root / n).mkdir(parents=True)
        extra = "always: true\n" if n in always else ""
        (root / n / "SKILL.md").write_text(f"---\nname: {n}\ndescription: Skill {n}.\n{extra}---\nDo {n}.\n")
    return root


# -- the document's examples, with jianmu renamed ------------------------------------------


def test_doc_example_for_chat(tmp_path):
    builder = ContextBuilder.for_chat(
        system_prompt="You are a helpful assistant.",
        max_messages=50,
        max_tokens=8000,
        runtime_prompt=PromptRuntimeContext(include_bootstrap_files=True),
    )
    assert chain(builder) == [S, B, H]
    assert filters(builder) == ["MaxMessagesFilter", "TokenBudgetFilter"]
    assert builder.providers[0].text == "You are a helpful assistant."
    assert builder.filters[0].max_messages == 50 and builder.filters[1].max_tokens == 8000
    assert isinstance(builder.providers[2], StateHistoryProvider)


def test_doc_example_for_react():
    builder = ContextBuilder.for_react(
        system_prompt="You are a math assistant.",
        tools_desc="- calculator: perform arithmetic\n- search: web search",
        max_messages=30,
        max_tokens=16000,
    )
    assert chain(builder) == [S, S, T, H]
    assert builder.providers[1].text == prompts.react_protocol_prompt()
    assert "Final Answer:" in builder.providers[1].text
    assert builder.providers[2].get_messages({})[0].content == (
        "Available tools:\n- calculator: perform arithmetic\n- search: web search"
    )
    assert (builder.filters[0].max_messages, builder.filters[1].max_tokens) == (30, 16000)


# -- chains -------------------------------------------------------------------------------


def test_chat_minimal_chain_and_default_persona():
    b = ContextBuilder.for_chat()
    assert chain(b) == [S, H] and b.filters == []
    assert b.providers[0].text == "You are a helpful assistant."


def test_react_without_tools_desc_has_no_tools_provider():
    assert chain(ContextBuilder.for_react()) == [S, S, H]
    assert chain(ContextBuilder.for_react(tools_desc="   ")) == [S, S, H]


def test_react_with_bootstrap():
    rp = PromptRuntimeContext(include_bootstrap_files=True, workspace_dir="/ws")
    b = ContextBuilder.for_react(tools_desc="- calc", runtime_prompt=rp)
    assert chain(b) == [S, S, T, B, H]
    assert b.providers[3].workspace_dir == "/ws"


def test_chat_and_react_ignore_skill_fields(tmp_path):
    make_skills(tmp_path / "cwd" / "skills", "x")
    rp = PromptRuntimeContext(skills_dir=str(tmp_path / "nope"), include_skills_summary=True,
                              include_active_skills=True, skills_catalog=SkillsCatalog([Skill("a", "A")]))
    assert chain(ContextBuilder.for_chat(runtime_prompt=rp)) == [S, H]
    assert chain(ContextBuilder.for_react(runtime_prompt=rp, tools_desc="- t")) == [S, S, T, H]


def test_skill_explicit_set_chain():
    skills = [Skill("a", "A.", "Do A.")]
    assert chain(ContextBuilder.for_skill(skill_set=skills)) == [S, S, K, H]
    assert chain(ContextBuilder.for_skill(skill_set=skills, include_react=False)) == [S, K, H]
    rp = PromptRuntimeContext(include_bootstrap_files=True)
    b = ContextBuilder.for_skill(skill_set=skills, tools_desc="- t", runtime_prompt=rp, mode="full")
    assert chain(b) == [S, S, T, B, K, H]
    assert b.providers[4].mode == "full" and b.providers[4].skills == skills


def test_skill_runtime_switches(tmp_path):
    root = make_skills(tmp_path / "sk", "a", "b", always=("b",))
    cases = [
        (dict(), [(False, "summary")]),
        (dict(include_skills_summary=True), [(False, "summary")]),
        (dict(include_active_skills=True), [(True, "summary")]),
        (dict(include_skills_summary=True, include_active_skills=True), [(False, "summary"), (True, "summary")]),
    ]
    for flags, expected in cases:
        b = ContextBuilder.for_skill(runtime_prompt=PromptRuntimeContext(skills_dir=str(root), **flags))
        skill_providers = [p for p in b.providers if isinstance(p, SkillSetPromptProvider)]
        assert [(p.always_only, p.mode) for p in skill_providers] == expected, flags
        assert all([s.name for s in p.skills] == ["a", "b"] for p in skill_providers)
        assert chain(b)[-1] == H


def test_skill_set_beats_runtime_discovery(tmp_path):
    root = make_skills(tmp_path / "sk", "found")
    b = ContextBuilder.for_skill(skill_set=[Skill("given", "G")], runtime_prompt=PromptRuntimeContext(skills_dir=str(root)))
    assert [s.name for s in b.providers[2].skills] == ["given"]


def test_skill_discovery_falls_back_to_cwd_skills(tmp_path):
    make_skills(tmp_path / "cwd" / "skills", "local")
    b = ContextBuilder.for_skill()
    assert [s.name for s in b.providers[2].skills] == ["local"]


def test_skill_options_reach_the_provider():
    b = ContextBuilder.for_skill(skill_set=[Skill("a", "A")], file_read_tools=("cat",), resource_root="/rt")
    assert b.providers[2].file_read_tools == ("cat",) and b.providers[2].resource_root == "/rt"


def test_presets_keep_the_subclass():
    class Mine(ContextBuilder):
        pass

    assert type(Mine.for_chat()) is Mine and type(Mine.for_react()) is Mine and type(Mine.for_skill(skill_set=[])) is Mine


# -- filters and config ----------------------------------------------------------------------


def test_filters_order_and_token_counter():
    counter = TiktokenTokenCounter("cl100k_base")
    b = ContextBuilder.for_chat(max_messages=3, max_tokens=500, token_counter=counter)
    assert isinstance(b.filters[0], MaxMessagesFilter) and isinstance(b.filters[1], TokenBudgetFilter)
    assert b.filters[1].counter is counter
    assert filters(ContextBuilder.for_chat(max_tokens=100)) == ["TokenBudgetFilter"]


def test_max_messages_falls_back_to_constraints(tmp_path):
    (tmp_path / "cwd" / "jianmu.yaml").write_text("constraints:\n  max_messages: 7\n")
    assert ContextBuilder.for_chat().filters[0].max_messages == 7
    assert ContextBuilder.for_react(max_messages=3).filters[0].max_messages == 3


def test_persona_and_protocol_from_config(tmp_path):
    (tmp_path / "cwd" / "jianmu.yaml").write_text(
        "prompt:\n  persona_default_prompt: You are Jianmu.\n  react_protocol_prompt: 'Think, act, then Final Answer:'\n"
    )
    b = ContextBuilder.for_react()
    assert [p.text for p in b.providers[:2]] == ["You are Jianmu.", "Think, act, then Final Answer:"]
    assert ContextBuilder.for_chat(system_prompt="Explicit.").providers[0].text == "Explicit."


def test_malformed_config_raises_at_preset_construction(tmp_path):
    (tmp_path / "cwd" / "jianmu.yaml").write_text("prompt:\n  persona_default_prompt: [x\n")
    with pytest.raises(ConfigError, match="jianmu.yaml:3"):
        ContextBuilder.for_chat()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(system_prompt=3), "system_prompt: expected a str"),
        (dict(runtime_prompt={"workspace_dir": "x"}), "runtime_prompt: expected a PromptRuntimeContext"),
        (dict(max_messages=0), "max_messages must be a positive int"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        ContextBuilder.for_chat(**kwargs)


def test_runtime_prompt_may_be_a_run_context():
    b = ContextBuilder.for_chat(runtime_prompt=RunContext(PromptRuntimeContext(include_bootstrap_files=True)))
    assert chain(b) == [S, B, H]


# -- end to end --------------------------------------------------------------------------------


def test_build_end_to_end_with_workspace_and_skills(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("Be careful.")
    root = make_skills(tmp_path / "sk", "a")
    rp = PromptRuntimeContext(workspace_dir=str(ws), include_bootstrap_files=True, skills_dir=str(root))
    b = ContextBuilder.for_skill(system_prompt="Persona.", runtime_prompt=rp, include_react=False)
    out = b.build({"messages": [human("hi"), ai("hello"), human("go")]})
    assert [m.role for m in out] == ["system", "system", "system", "user", "assistant", "user"]
    assert out[0].content == "Persona."
    assert out[1].content == "## AGENTS.md\n\nBe careful."
    assert out[2].content.startswith("# Skills\n\n")
    assert [m.content for m in out[3:]] == ["hi", "hello", "go"]


def test_same_workspace_skills_history_give_identical_bytes(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("Rules.\n")
    root = make_skills(tmp_path / "sk", "b", "a", always=("a",))
    history = [human("q1").to_openai(), ai("a1").to_openai(), human("q2").to_openai()]

    def render():
        rp = PromptRuntimeContext(workspace_dir=str(ws), include_bootstrap_files=True, skills_dir=str(root),
                                  include_skills_summary=True, include_active_skills=True)
        b = ContextBuilder.for_skill(runtime_prompt=rp, tools_desc="- read_file: read a file", max_messages=10)
        tools = [{"type": "function", "function": {"name": "read_file"}}]
        return json.dumps([m.to_openai() for m in b.build({"messages": history}, tools_schema=tools)])

    first = render()
    clear_config_cache()
    assert render() == first
    assert "# Active Skills" in first and "## AGENTS.md" in first


def test_providers_are_plain_instances():
    b = ContextBuilder.for_react(tools_desc="- t", runtime_prompt=PromptRuntimeContext(include_bootstrap_files=True))
    assert isinstance(b.providers[0], StaticPromptProvider)
    assert isinstance(b.providers[2], ToolsDescProvider)
    assert isinstance(b.providers[3], BootstrapFilesProvider)
