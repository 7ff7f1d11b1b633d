"""jianmu.yaml: where it is found, overrides of every prompt field, errors and warnings."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from jianmu_fast.config import (
    Constraints,
    JianmuConfigWarning,
    clear_config_cache,
    config_path,
    load_config,
    prompts,
    reload_config,
)
from jianmu_fast.errors import ConfigError, JianmuError
from jianmu_fast.memory.context import StaticPromptProvider, ToolsDescProvider


pytestmark = pytest.mark.usefixtures("config_sandbox")


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


FIELDS = [
    ("persona_default_prompt", prompts.DEFAULT_PERSONA_PROMPT),
    ("react_protocol_prompt", prompts.DEFAULT_REACT_PROTOCOL_PROMPT),
    ("history_semantics_prompt", prompts.DEFAULT_HISTORY_SEMANTICS_PROMPT),
    ("skill_capability_policy_prompt", prompts.DEFAULT_SKILL_CAPABILITY_POLICY_PROMPT),
    ("skill_on_demand_policy_prompt", prompts.DEFAULT_SKILL_ON_DEMAND_POLICY_PROMPT),
    ("skill_fallback_policy_prompt", prompts.DEFAULT_SKILL_FALLBACK_POLICY_PROMPT),
    ("skill_resource_usage_policy_prompt", prompts.DEFAULT_SKILL_RESOURCE_USAGE_POLICY_PROMPT),
    ("tools_prompt_template", "Available tools:\n{tools_desc}"),
]


def test_defaults_without_a_file():
    assert config_path() is None
    assert prompts.persona_default_prompt() == "You are a helpful assistant."
    assert "Final Answer:" in prompts.react_protocol_prompt()
    text = prompts.history_semantics_prompt()
    assert "self_tool_plan" in text and "tool_observation" in text
    assert "type: bt" in prompts.skill_capability_policy_prompt()
    assert prompts.tools_prompt_template() == "Available tools:\n{tools_desc}"
    assert prompts.bootstrap_files() == ["AGENTS.md"]
    assert Constraints.load() == Constraints(max_messages=None)


@pytest.mark.parametrize("field,default", FIELDS)
def test_each_prompt_field_is_overridden_from_cwd_file(tmp_path, field, default):
    assert getattr(prompts, field)() == default
    value = "Custom {tools_desc} text" if field == "tools_prompt_template" else f"Custom {field}."
    write(tmp_path / "jianmu.yaml", f"prompt:\n  {field}: {value!r}\n")
    clear_config_cache()
    assert getattr(prompts, field)() == value


def test_bootstrap_files_override_list_and_single_string(tmp_path):
    write(tmp_path / "jianmu.yaml", "prompt:\n  bootstrap_files: [AGENTS.md, docs/GUIDE.md]\n")
    assert prompts.bootstrap_files() == ["AGENTS.md", "docs/GUIDE.md"]
    prompts.bootstrap_files().append("x")  # a fresh list each call: the cache is not mutated
    assert prompts.bootstrap_files() == ["AGENTS.md", "docs/GUIDE.md"]
    write(tmp_path / "jianmu.yaml", "prompt:\n  bootstrap_files: README.md\n")
    clear_config_cache()
    assert prompts.bootstrap_files() == ["README.md"]


def test_env_var_wins_over_cwd_file(tmp_path, monkeypatch):
    write(tmp_path / "jianmu.yaml", "prompt:\n  persona_default_prompt: from cwd\n")
    other = write(tmp_path / "other.yaml", "prompt:\n  persona_default_prompt: from env\n")
    assert prompts.persona_default_prompt() == "from cwd"
    monkeypatch.setenv("JIANMU_CONFIG", str(other))
    assert config_path() == other
    assert prompts.persona_default_prompt() == "from env"


def test_env_var_naming_a_missing_file_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("JIANMU_CONFIG", str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match=r"JIANMU_CONFIG=.*nope\.yaml.*no such file"):
        prompts.persona_default_prompt()


def test_file_edit_is_seen_through_mtime_cache(tmp_path):
    p = write(tmp_path / "jianmu.yaml", "prompt:\n  persona_default_prompt: one\n")
    first = load_config()
    assert load_config() is first  # cached
    write(p, "prompt:\n  persona_default_prompt: two!\n")  # different size: a new cache key
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    assert prompts.persona_default_prompt() == "two!"
    assert reload_config() is not first


def test_malformed_yaml_names_file_and_line(tmp_path, monkeypatch):
    bad = write(tmp_path / "bad.yaml", "prompt:\n  persona_default_prompt: ok\n  react_protocol_prompt: [unclosed\n")
    monkeypatch.setenv("JIANMU_CONFIG", str(bad))
    with pytest.raises(ConfigError) as info:
        prompts.persona_default_prompt()
    msg = str(info.value)
    assert f"{bad}:" in msg and "malformed YAML" in msg
    assert msg.split(f"{bad}:")[1].split(":")[0] == "4"  # the line where pyyaml saw the problem
    assert isinstance(info.value, JianmuError) and isinstance(info.value, ValueError)


def test_config_error_is_not_swallowed_by_builder_isolation(tmp_path):
    write(tmp_path / "jianmu.yaml", "prompt: [\n")
    from jianmu_fast.memory.context import ContextBuilder

    b = ContextBuilder(providers=[StaticPromptProvider("x"), ToolsDescProvider("- calc")])
    with pytest.raises(ConfigError, match="jianmu.yaml"):
        b.build({})


@pytest.mark.parametrize(
    "text,key,line",
    [
        ("prompt:\n  persona_default_prompt: 3\n", "prompt.persona_default_prompt", 2),
        ("prompt:\n  react_protocol_prompt: [a, b]\n", "prompt.react_protocol_prompt", 2),
        ("prompt:\n  tools_prompt_template: 'no placeholder'\n", "prompt.tools_prompt_template", 2),
        ("prompt:\n  bootstrap_files: [AGENTS.md, 3]\n", "prompt.bootstrap_files", 2),
        ("constraints:\n  max_messages: 0\n", "constraints.max_messages", 2),
        ("constraints:\n  max_messages: true\n", "constraints.max_messages", 2),
        ("constraints:\n  max_messages: '20'\n", "constraints.max_messages", 2),
        ("paths:\n  skills_dir: 5\n", "paths.skills_dir", 2),
        ("\n\nprompt: just text\n", "prompt", 3),
    ],
)
def test_wrong_types_name_the_key_and_line(tmp_path, text, key, line):
    p = write(tmp_path / "jianmu.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_config()
    assert f"{p}:{line}: {key}:" in str(info.value)


def test_top_level_not_a_mapping(tmp_path):
    write(tmp_path / "jianmu.yaml", "- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config()


def test_empty_file_is_the_empty_config(tmp_path):
    write(tmp_path / "jianmu.yaml", "# nothing yet\n")
    cfg = load_config()
    assert cfg.path == tmp_path / "jianmu.yaml" and dict(cfg.prompt) == {}
    assert prompts.persona_default_prompt() == "You are a helpful assistant."


@pytest.mark.parametrize(
    "text,key",
    [
        ("promt:\n  persona_default_prompt: x\n", "promt"),
        ("prompt:\n  persona_prompt: x\n", "prompt.persona_prompt"),
        ("paths:\n  skill_dir: x\n", "paths.skill_dir"),
        ("constraints:\n  max_tokens: 10\n", "constraints.max_tokens"),
    ],
)
def test_unknown_key_is_a_warning_naming_key_and_file(tmp_path, text, key):
    p = write(tmp_path / "jianmu.yaml", text)
    with pytest.warns(JianmuConfigWarning) as record:
        cfg = load_config()
    assert len(record) == 1
    msg = str(record[0].message)
    assert f"{key!r}" in msg and f"{p}:" in msg
    assert key.split(".")[-1] not in cfg.prompt


def test_unknown_key_warns_once_per_file_version(tmp_path):
    write(tmp_path / "jianmu.yaml", "prompt:\n  typo: x\n  persona_default_prompt: kept\n")
    with pytest.warns(JianmuConfigWarning):
        assert prompts.persona_default_prompt() == "kept"
    assert prompts.persona_default_prompt() == "kept"  # cached: no second warning (would be an error)


def test_paths_resolve_against_the_files_directory(tmp_path, monkeypatch):
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    p = write(conf_dir / "j.yaml", f"paths:\n  skills_dir: skills\n  workspace_dir: {tmp_path}\n")
    monkeypatch.setenv("JIANMU_CONFIG", str(p))
    cfg = load_config()
    assert cfg.paths == {"skills_dir": str(conf_dir / "skills"), "workspace_dir": str(tmp_path)}


def test_constraints_from_config(tmp_path):
    write(tmp_path / "jianmu.yaml", "constraints:\n  max_messages: 20\n")
    assert Constraints.load() == Constraints(max_messages=20)
    with pytest.raises(ValueError, match="max_messages must be a positive int"):
        Constraints(max_messages=-1)


def test_tools_desc_provider_uses_configured_template(tmp_path):
    write(tmp_path / "jianmu.yaml", "prompt:\n  tools_prompt_template: \"Tools you may call:\\n{tools_desc}\"\n")
    assert ToolsDescProvider("- calc").get_messages({})[0].content == "Tools you may call:\n- calc"


def test_invalid_utf8_file(tmp_path):
    (tmp_path / "jianmu.yaml").write_bytes(b"prompt:\n  persona_default_prompt: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_config()


def test_unknown_field_name_in_override_is_a_bug():
    with pytest.raises(KeyError, match="unknown prompt field 'nope'"):
        prompts._prompt_override("nope", "x")


def test_importing_the_package_does_not_load_pyyaml_or_read_config(tmp_path):
    """Configuration is read at first use: a broken jianmu.yaml cannot break ``import``."""
    import subprocess
    import sys

    (tmp_path / "jianmu.yaml").write_text("prompt: [\n")
    code = (
        "import sys, jianmu_fast, jianmu_fast.memory.context, jianmu_fast.skills, jianmu_fast.config; "
        "print('yaml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- item 10 of issue 12: alias bombs and deep nesting are ConfigError, file and line, fast ----

def _bomb(section: str, key: str) -> str:
    """A "billion laughs": nine levels of nine aliases (9**9 values once expanded), ~400 bytes."""
    levels = ["&a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for p, c in zip("abcdefgh", "bcdefghi"):
        levels.append(f"&{c} [" + ",".join([f"*{p}"] * 9) + "]")
    return f"# a bomb\n{section}:\n  {key}: [{', '.join(levels)}]\n"


_BOMB_SCRIPT = r"""
import json, sys
from jianmu_fast.config import load_config
from jianmu_fast.errors import ConfigError
try:
    load_config()
    print(json.dumps({"error": None}))
except ConfigError as exc:
    print(json.dumps({"error": str(exc)}))
"""


@pytest.mark.parametrize(
    "section,key", [("prompt", "persona_default_prompt"), ("prompt", "bootstrap_files"),
                    ("paths", "skills_dir"), ("constraints", "max_messages")]
)
def test_alias_bomb_is_a_config_error_with_file_and_line(tmp_path, section, key):
    import json
    import subprocess
    import sys

    p = write(tmp_path / "jianmu.yaml", _bomb(section, key))
    assert len(p.read_bytes()) < 420
    # a subprocess, so that a hang (today's main: memory grows without end) fails the test
    # at the timeout instead of taking the test run down
    env = {**os.environ, "JIANMU_CONFIG": str(p)}
    done = subprocess.run([sys.executable, "-c", _BOMB_SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    msg = json.loads(done.stdout)["error"]
    assert msg is not None and msg.startswith(f"{p}:3:")
    assert "aliases" in msg and len(msg) < 600  # names the problem, never formats the expanded value


def test_alias_bomb_in_process_and_in_skill_front_matter(tmp_path):
    from jianmu_fast.skills import parse_skill_md

    write(tmp_path / "jianmu.yaml", _bomb("prompt", "persona_default_prompt"))
    with pytest.raises(ConfigError, match=r"jianmu\.yaml:3:\d+: malformed YAML: the document expands"):
        load_config()
    front = _bomb("metadata", "x").replace("# a bomb\n", "")
    with pytest.raises(ConfigError, match=r"SKILL\.md:4: malformed front matter: the document expands"):
        parse_skill_md(f"---\nname: n\n{front}---\nbody\n", tmp_path / "SKILL.md")


def test_a_few_aliases_still_work(tmp_path):
    write(tmp_path / "jianmu.yaml", "prompt:\n  bootstrap_files: &files [A.md, B.md]\n  react_protocol_prompt: &t hi\n"
          "  persona_default_prompt: *t\n")
    cfg = load_config()
    assert cfg.prompt["bootstrap_files"] == ("A.md", "B.md") and cfg.prompt["persona_default_prompt"] == "hi"


@pytest.mark.parametrize(
    "text,line",
    [
        ("prompt:\n  persona_default_prompt: " + "[" * 5000 + "]" * 5000 + "\n", 2),
        ("constraints:\n  max_messages: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", 2),
        ("paths:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(200)) + "  " * 201 + "v: 1\n", None),
    ],
)
def test_deep_nesting_is_a_config_error_not_a_recursion_error(tmp_path, text, line):
    p = write(tmp_path / "jianmu.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_config()
    msg = str(info.value)
    assert "nested deeper than 64 levels" in msg and msg.startswith(f"{p}:")
    if line is not None:
        assert msg.startswith(f"{p}:{line}:")


def test_long_wrong_value_is_shortened_in_the_error(tmp_path):
    p = write(tmp_path / "jianmu.yaml", "constraints:\n  max_messages: [" + ", ".join(["x" * 100] * 1000) + "]\n")
    with pytest.raises(ConfigError) as info:
        load_config()
    assert str(info.value).startswith(f"{p}:2: constraints.max_messages: expected a positive integer")
    assert len(str(info.value)) < 500


@pytest.mark.parametrize("kind", ["bomb", "deep"])
def test_cli_exits_2_on_a_bad_config(tmp_path, capsys, kind):
    from jianmu_fast import cli

    text = _bomb("prompt", "persona_default_prompt") if kind == "bomb" else "prompt:\n  x: " + "[" * 3000 + "]" * 3000
    p = write(tmp_path / "jianmu.yaml", text)
    src = tmp_path / "in.jsonl"
    src.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert cli.main(["build", str(src), "-o", str(tmp_path / "out.jsonl"), "--max-tokens", "100"]) == 2
    err = capsys.readouterr().err
    assert f"ConfigError: {p}:" in err and "Traceback" not in err


def test_oversized_config_file_is_a_config_error_naming_it(tmp_path):
    from jianmu_fast.config.loader import MAX_CONFIG_BYTES

    p = write(tmp_path / "jianmu.yaml", "prompt:\n  persona_default_prompt: x\n")
    with open(p, "r+b") as fh:
        fh.truncate(MAX_CONFIG_BYTES + 1)  # sparse: never written, must never be read whole
    with pytest.raises(ConfigError, match=rf"^{p}: the configuration file is {MAX_CONFIG_BYTES + 1} bytes"):
        load_config()
