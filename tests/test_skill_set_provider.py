"""SkillSetPromptProvider: every mode, file-tool detection, resource mapping, determinism."""

from __future__ import annotations

import json

import pytest

from jianmu_fast.config import prompts
from jianmu_fast.memory.context import ContextBuilder, SkillSetPromptProvider
from jianmu_fast.memory.context.providers.skill_set import tool_names
from jianmu_fast.skills import Skill, SkillsCatalog

CAP = prompts.DEFAULT_SKILL_CAPABILITY_POLICY_PROMPT
ON_DEMAND = prompts.DEFAULT_SKILL_ON_DEMAND_POLICY_PROMPT
FALLBACK = prompts.DEFAULT_SKILL_FALLBACK_POLICY_PROMPT
RESOURCES = prompts.DEFAULT_SKILL_RESOURCE_USAGE_POLICY_PROMPT

READ_FILE = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
CALC = [{"type": "function", "function": {"name": "calculator"}}]


pytestmark = pytest.mark.usefixtures("config_sandbox")


@pytest.fixture
def skills():
    return [
        Skill("report", "Write a report.", "1. Gather.\n2. Write.", path="/sk/report/SKILL.md",
              resources=("templates/r.md",)),
        Skill("deploy", "Deploy the service.", "Runs the deploy tree.", type="bt", always=True,
              path="/sk/deploy/SKILL.md"),
    ]


def text(provider, tools_schema=None):
    msgs = provider.get_messages({}, None, None, tools_schema=tools_schema)
    assert [m.role for m in msgs] == ["system"]
    return msgs[0].content


INDEX = "Available skills:\n- report: Write a report.\n- deploy (type: bt): Deploy the service."
INDEX_PATHS = (
    "Available skills:\n- report: Write a report.\n  SKILL.md: /sk/report/SKILL.md\n"
    "- deploy (type: bt): Deploy the service.\n  SKILL.md: /sk/deploy/SKILL.md"
)
BLOCKS = (
    "Skill instructions:\n\n## report\n\n1. Gather.\n2. Write.\n\nResources: templates/r.md"
    "\n\n## deploy (type: bt)\n\nRuns the deploy tree."
)


def test_summary_with_file_tool_gives_index_paths_and_on_demand_policy(skills):
    assert text(SkillSetPromptProvider(skills), READ_FILE) == "\n\n".join(["# Skills", CAP, INDEX_PATHS, ON_DEMAND])


def test_summary_without_file_tool_inlines_instructions_with_fallback_policy(skills):
    expected = "\n\n".join(["# Skills", CAP, INDEX, FALLBACK, BLOCKS, RESOURCES, "Skill directories:\n- report: /sk/report"])
    p = SkillSetPromptProvider(skills)
    assert text(p, CALC) == expected
    assert text(p, None) == expected
    assert text(p, []) == expected


def test_full_mode_has_skill_instructions_heading(skills):
    expected = "\n\n".join(["# Skills", CAP, INDEX, BLOCKS, RESOURCES, "Skill directories:\n- report: /sk/report"])
    p = SkillSetPromptProvider(skills, mode="full")
    assert text(p) == expected
    assert text(p, READ_FILE) == expected  # full mode does not depend on the tools


def test_full_mode_runtime_resource_mapping(skills):
    p = SkillSetPromptProvider(skills, mode="full", resource_root="/runtime/skills/",
                               resource_paths={"deploy": "/opt/deploy"})
    assert text(p).endswith(
        RESOURCES + "\n\nSkill directories:\n- report: /runtime/skills/report\n- deploy: /opt/deploy"
    )
    # the index paths of on-demand mode use the same mapping
    on_demand = text(SkillSetPromptProvider(skills, resource_root="/runtime/skills"), READ_FILE)
    assert "  SKILL.md: /runtime/skills/report/SKILL.md" in on_demand


def test_no_resources_and_no_mapping_means_no_resource_policy():
    p = SkillSetPromptProvider([Skill("a", "A.", "Do A.", path="/sk/a/SKILL.md")], mode="full")
    assert text(p) == "\n\n".join(["# Skills", CAP, "Available skills:\n- a: A.", "Skill instructions:\n\n## a\n\nDo A."])


def test_always_only_renders_only_active_skills(skills):
    assert text(SkillSetPromptProvider(skills, always_only=True)) == "# Active Skills\n\n## deploy (type: bt)\n\nRuns the deploy tree."
    assert SkillSetPromptProvider(skills[:1], always_only=True).get_messages({}) == []


def test_empty_skill_set_gives_nothing():
    assert SkillSetPromptProvider([]).get_messages({}, tools_schema=READ_FILE) == []
    assert SkillSetPromptProvider(SkillsCatalog()).get_messages({}) == []


@pytest.mark.parametrize(
    "schema,expected",
    [
        ([{"type": "function", "function": {"name": "read_file"}}], True),
        ([{"name": "read_file"}], True),
        ([{"name": "calculator"}, {"name": "view_file"}], True),
        ([{"type": "function", "function": {"name": "write_file"}}], False),
        ([{"type": "function"}], False),
    ],
)
def test_file_tool_detection(schema, expected):
    assert SkillSetPromptProvider([]).has_file_tool(schema) is expected


def test_file_read_tools_are_configurable(skills):
    p = SkillSetPromptProvider(skills, file_read_tools=["fetch_doc"])
    assert ON_DEMAND in text(p, [{"name": "fetch_doc"}])
    assert FALLBACK in text(p, READ_FILE)


def test_tool_names_accepts_objects():
    class T:
        name = "read_file"

    assert tool_names([T(), {"function": {"name": "x"}}, 3]) == ["read_file", "x"]


def test_builder_passes_tools_schema(skills):
    b = ContextBuilder(providers=[SkillSetPromptProvider(skills)])
    assert ON_DEMAND in b.build({}, tools_schema=READ_FILE)[0].content
    assert FALLBACK in b.build({})[0].content


def test_catalog_accepted_and_order_kept(tmp_path):
    root = tmp_path / "skills"
    for n in ("b", "a"):
        (root / n).mkdir(parents=True)
        (root / n / "SKILL.md").write_text(f"---\nname: {n}\ndescription: Skill {n}.\n---\nDo {n}.\n")
    out = text(SkillSetPromptProvider(SkillsCatalog.from_dir(root)), READ_FILE)
    assert out.index("- a: Skill a.") < out.index("- b: Skill b.")
    assert f"SKILL.md: {root / 'a' / 'SKILL.md'}" in out
    listed = text(SkillSetPromptProvider([Skill("z", "Z"), Skill("y", "Y")]))
    assert listed.index("- z: Z") < listed.index("- y: Y")


def test_configured_policy_texts(tmp_path, skills):
    (tmp_path / "jianmu.yaml").write_text(
        "prompt:\n  skill_capability_policy_prompt: CAPS\n  skill_on_demand_policy_prompt: LAZY\n"
        "  skill_fallback_policy_prompt: INLINE\n  skill_resource_usage_policy_prompt: RES\n"
    )
    assert text(SkillSetPromptProvider(skills), READ_FILE) == "\n\n".join(["# Skills", "CAPS", INDEX_PATHS, "LAZY"])
    fb = text(SkillSetPromptProvider(skills))
    assert "\n\nINLINE\n\n" in fb and "\n\nRES\n\n" in fb


def test_deterministic_bytes(tmp_path):
    root = tmp_path / "skills"
    for n in ("x", "w"):
        (root / n / "res").mkdir(parents=True)
        (root / n / "SKILL.md").write_text(f"---\nname: {n}\ndescription: Skill {n}.\n---\nDo {n}.\n")
        (root / n / "res" / "f.txt").write_text("r")
    runs = []
    for _ in range(2):
        for mode in ("summary", "full"):
            p = SkillSetPromptProvider(SkillsCatalog.from_dir(root), mode=mode)
            runs.append(json.dumps([m.to_openai() for m in p.get_messages({}, tools_schema=READ_FILE)]))
    assert runs[0] == runs[2] and runs[1] == runs[3] and runs[0] != runs[1]


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"mode": "brief"}, ValueError, "mode must be 'summary' or 'full'"),
        ({"always_only": 1}, TypeError, "always_only"),
        ({"file_read_tools": "read_file"}, TypeError, "file_read_tools"),
        ({"resource_paths": {"a": 3}}, TypeError, r"resource_paths\['a'\]"),
        ({"resource_root": 3}, TypeError, "resource_root"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SkillSetPromptProvider([], **kwargs)


def test_bad_skill_set():
    with pytest.raises(TypeError, match=r"skill_set\[0\]"):
        SkillSetPromptProvider([{"name": "x"}])
