"""resolve_for_llm: each step of the priority chain, and what reaches the chosen preset."""

from __future__ import annotations

import pytest

from jianmu_fast.memory.context import (
    ContextBuilder,
    PromptRuntimeContext,
    SkillSetPromptProvider,
    StaticPromptProvider,
    resolve_for_llm,
)
from jianmu_fast.skills import Skill, SkillsCatalog

S, B, T, K, H = "StaticPromptProvider", "BootstrapFilesProvider", "ToolsDescProvider", "SkillSetPromptProvider", "StateHistoryProvider"


pytestmark = pytest.mark.usefixtures("config_sandbox")


def chain(builder):
    return [type(p).__name__ for p in builder.providers]


EXPLICIT = ContextBuilder(providers=[StaticPromptProvider("explicit")])
RUNTIME = ContextBuilder(providers=[StaticPromptProvider("runtime")])
SKILLS = [Skill("a", "A.", "Do A.")]


def test_1_explicit_builder_beats_everything():
    rp = PromptRuntimeContext(context_builder=RUNTIME, include_skills_summary=True)
    got = resolve_for_llm(EXPLICIT, runtime_prompt=rp, tools_desc="- t", skill_set=SKILLS,
                          allow_skill_context=True, prefer_react=True)
    assert got is EXPLICIT


def test_2_runtime_builder_beats_presets():
    rp = PromptRuntimeContext(context_builder=RUNTIME, include_skills_summary=True)
    assert resolve_for_llm(runtime_prompt=rp, tools_desc="- t", skill_set=SKILLS,
                           allow_skill_context=True, prefer_react=True) is RUNTIME


def test_3_skill_path_with_explicit_skill_set():
    b = resolve_for_llm(skill_set=SKILLS, allow_skill_context=True, tools_desc="- t", system_prompt="P.")
    assert chain(b) == [S, S, T, K, H]
    assert b.providers[0].text == "P." and b.providers[3].skills == SKILLS


@pytest.mark.parametrize(
    "field",
    ["skills_catalog", "skills_dir", "include_skills_summary", "include_active_skills"],
)
def test_3_skill_path_with_each_runtime_skill_request(tmp_path, field):
    (tmp_path / "sk").mkdir()
    value = {
        "skills_catalog": SkillsCatalog(SKILLS),
        "skills_dir": str(tmp_path / "sk"),
        "include_skills_summary": True,
        "include_active_skills": True,
    }[field]
    rp = PromptRuntimeContext(**{field: value})
    assert K in chain(resolve_for_llm(runtime_prompt=rp, allow_skill_context=True))
    # without allow_skill_context the skill request is ignored: chat
    assert chain(resolve_for_llm(runtime_prompt=rp)) == [S, H]


def test_3_skill_path_needs_a_request():
    # allowed, but nothing asks for skills: falls through to react / chat
    assert chain(resolve_for_llm(allow_skill_context=True)) == [S, H]
    assert chain(resolve_for_llm(allow_skill_context=True, prefer_react=True)) == [S, S, H]
    assert chain(resolve_for_llm(allow_skill_context=True, runtime_prompt=PromptRuntimeContext(include_bootstrap_files=True))) == [S, B, H]


def test_3_skill_set_without_permission_is_ignored():
    assert chain(resolve_for_llm(skill_set=SKILLS)) == [S, H]
    assert chain(resolve_for_llm(skill_set=SKILLS, tools_desc="- t")) == [S, S, T, H]


def test_4_react_by_prefer_react_or_tools_desc():
    assert chain(resolve_for_llm(prefer_react=True)) == [S, S, H]  # AgentLLMNode: tools not known yet
    assert chain(resolve_for_llm(tools_desc="- calc")) == [S, S, T, H]
    assert chain(resolve_for_llm(tools_desc="  \n")) == [S, H]  # blank tools_desc: not react


def test_5_chat_default():
    b = resolve_for_llm()
    assert chain(b) == [S, H] and b.providers[0].text == "You are a helpful assistant."


def test_preset_kwargs_reach_the_preset():
    b = resolve_for_llm(max_messages=5, max_tokens=900)
    assert [type(f).__name__ for f in b.filters] == ["MaxMessagesFilter", "TokenBudgetFilter"]
    sk = resolve_for_llm(skill_set=SKILLS, allow_skill_context=True, mode="full", include_react=False)
    assert chain(sk) == [S, K, H]
    provider = sk.providers[1]
    assert isinstance(provider, SkillSetPromptProvider) and provider.mode == "full"


def test_skill_only_kwargs_are_dropped_off_the_skill_path():
    b = resolve_for_llm(mode="full", include_react=False, tools_desc="- t")
    assert chain(b) == [S, S, T, H]


def test_unknown_kwargs_are_an_error():
    with pytest.raises(TypeError, match="max_msgs"):
        resolve_for_llm(max_msgs=3)


def test_runtime_workspace_is_consumed_on_every_path(tmp_path):
    rp = PromptRuntimeContext(include_bootstrap_files=True, workspace_dir=str(tmp_path))
    for b in (resolve_for_llm(runtime_prompt=rp), resolve_for_llm(runtime_prompt=rp, prefer_react=True),
              resolve_for_llm(runtime_prompt=rp, skill_set=SKILLS, allow_skill_context=True)):
        boot = [p for p in b.providers if type(p).__name__ == B]
        assert len(boot) == 1 and boot[0].workspace_dir == str(tmp_path)


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        ((object(),), {}, "context_builder: expected a ContextBuilderProtocol"),
        ((), {"runtime_prompt": "x"}, "runtime_prompt: expected a PromptRuntimeContext"),
        ((), {"tools_desc": 3}, "tools_desc: expected a str"),
    ],
)
def test_bad_arguments(args, kwargs, match):
    with pytest.raises(TypeError, match=match):
        resolve_for_llm(*args, **kwargs)


def test_runtime_context_builder_must_be_a_builder():
    with pytest.raises(TypeError, match="PromptRuntimeContext.context_builder"):
        PromptRuntimeContext(context_builder=object())
