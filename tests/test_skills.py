"""Skills: SKILL.md parsing, resources, SkillsCatalog loading and runtime resolution."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from jianmu_fast.errors import ConfigError
from jianmu_fast.memory.context import PromptRuntimeContext
from jianmu_fast.skills import Skill, SkillsCatalog, as_skill_list, load_skill, parse_skill_md


pytestmark = pytest.mark.usefixtures("config_sandbox_subdir")


def make_skill(root: Path, dirname: str, name: str | None = None, body: str = "Do it.", extra: str = "") -> Path:
    d = root / dirname
    d.mkdir(parents=True, exist_ok=True)
    f = d / "SKILL.md"
    f.write_text(f"---\nname: {name or dirname}\ndescription: The {dirname} skill.\n{extra}---\n{body}\n")
    return f


def test_parse_front_matter_and_body():
    s = parse_skill_md(
        "---\nname: pdf\ndescription: >\n  Build a PDF\n  report.\ntype: bt\nalways: true\nlicense: MIT\n---\n\n# Steps\n1. a\n\n",
        "/x/pdf/SKILL.md",
    )
    assert (s.name, s.description, s.type, s.always) == ("pdf", "Build a PDF report.", "bt", True)
    assert s.instructions == "# Steps\n1. a"
    assert s.path == Path("/x/pdf/SKILL.md") and s.directory == Path("/x/pdf")
    assert dict(s.metadata) == {"license": "MIT"}


def test_defaults_type_prompt_always_false():
    s = parse_skill_md("---\nname: a\ndescription: b\n---\nbody")
    assert (s.type, s.always, s.path, s.resources) == ("prompt", False, None, ())


@pytest.mark.parametrize(
    "text,match",
    [
        ("name: a\n", r"<SKILL.md>:1: SKILL.md must start with a '---' line"),
        ("---\nname: a\ndescription: b\n", "never closed"),
        ("---\nname: a\ndescription: b: c\n---\n", r"<SKILL.md>:3: malformed front matter"),
        ("---\n- a\n---\n", "must be a mapping"),
        ("---\ndescription: b\n---\n", "'name' is required"),
        ("---\nname: a\n---\n", "'description' is required"),
        ("---\nname: a\ndescription: b\ntype: tree\n---\n", "type must be 'prompt' or 'bt'"),
        ("---\nname: a\ndescription: b\nalways: maybe\n---\n", "always must be true or false"),
    ],
)
def test_malformed_skill_md(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_skill_md(text)


def test_resources_are_relative_sorted_and_skip_hidden(tmp_path):
    f = make_skill(tmp_path, "s")
    for rel in ("z.txt", "scripts/run.py", "a/b/c.md", ".hidden", ".git/config"):
        p = f.parent / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    assert load_skill(f).resources == ("a/b/c.md", "scripts/run.py", "z.txt")


def test_from_dir_sorted_and_malformed_skipped_with_log(tmp_path, caplog):
    root = tmp_path / "skills"
    make_skill(root, "zeta")
    make_skill(root, "alpha")
    bad = root / "broken" / "SKILL.md"
    bad.parent.mkdir()
    bad.write_text("no front matter")
    (root / "not-a-skill").mkdir()
    (root / ".hidden").mkdir()
    make_skill(root, ".hidden")
    (root / "README.md").write_text("x")
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.skills"):
        cat = SkillsCatalog.from_dir(root)
    assert [s.name for s in cat.skills] == ["alpha", "zeta"]
    assert cat.root == root
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and str(bad) in msgs[0]


def test_duplicate_names_name_both_files(tmp_path):
    root = tmp_path / "skills"
    a = make_skill(root, "one", name="same")
    b = make_skill(root, "two", name="same")
    with pytest.raises(ConfigError) as info:
        SkillsCatalog.from_dir(root)
    assert str(a) in str(info.value) and str(b) in str(info.value) and "'same'" in str(info.value)


def test_missing_dir_is_an_error_unless_missing_ok(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        SkillsCatalog.from_dir(tmp_path / "nope")
    assert len(SkillsCatalog.from_dir(tmp_path / "nope", missing_ok=True)) == 0


def test_as_skill_list_accepts_every_skill_set_shape():
    a, b = Skill("a", "A"), Skill("b", "B")
    cat = SkillsCatalog([b, a])
    assert as_skill_list(cat) == [b, a]
    assert as_skill_list([b, a]) == [b, a]
    assert as_skill_list((a,)) == [a]
    assert as_skill_list(a) == [a]
    assert as_skill_list(None) == []
    with pytest.raises(TypeError, match=r"skill_set\[1\]: expected a Skill, got dict"):
        as_skill_list([a, {"name": "b"}])
    with pytest.raises(TypeError, match="SkillsCatalog.from_dir"):
        as_skill_list("skills/")
    with pytest.raises(ConfigError, match="two skills are named 'a'"):
        as_skill_list([a, Skill("a", "again")])


def test_resolve_runtime_priority(tmp_path):
    rt_dir, conf_dir, cwd_dir = tmp_path / "rt", tmp_path / "conf", tmp_path / "cwd" / "skills"
    make_skill(rt_dir, "from-rt")
    make_skill(conf_dir, "from-conf")
    make_skill(cwd_dir, "from-cwd")
    given = SkillsCatalog([Skill("given", "G")])
    names = lambda cat: [s.name for s in cat]  # noqa: E731

    # 1. skills_catalog beats skills_dir
    rp = PromptRuntimeContext(skills_catalog=given, skills_dir=str(rt_dir))
    assert SkillsCatalog.resolve_runtime(rp) is given
    assert names(SkillsCatalog.resolve_runtime(PromptRuntimeContext(skills_catalog=[Skill("l", "L")]))) == ["l"]
    # 2. skills_dir beats the config
    (tmp_path / "cwd" / "jianmu.yaml").write_text(f"paths:\n  skills_dir: {conf_dir}\n")
    assert names(SkillsCatalog.resolve_runtime(PromptRuntimeContext(skills_dir=str(rt_dir)))) == ["from-rt"]
    # 3. config paths.skills_dir beats ./skills
    assert names(SkillsCatalog.resolve_runtime(PromptRuntimeContext())) == ["from-conf"]
    assert names(SkillsCatalog.resolve_runtime(None)) == ["from-conf"]
    # 4. ./skills
    (tmp_path / "cwd" / "jianmu.yaml").unlink()
    assert names(SkillsCatalog.resolve_runtime(None)) == ["from-cwd"]


def test_resolve_runtime_explicit_config_and_missing_dirs(tmp_path):
    from jianmu_fast.config import JianmuConfig

    conf_dir = tmp_path / "conf"
    make_skill(conf_dir, "c")
    cfg = JianmuConfig(paths={"skills_dir": str(conf_dir)})
    assert [s.name for s in SkillsCatalog.resolve_runtime(None, cfg)] == ["c"]
    assert len(SkillsCatalog.resolve_runtime(None)) == 0  # no ./skills: empty
    with pytest.raises(ConfigError, match="skills directory .*nope"):
        SkillsCatalog.resolve_runtime(PromptRuntimeContext(skills_dir=str(tmp_path / "nope")))


def test_skill_validation_messages():
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        Skill("", "x")
    with pytest.raises(ValueError, match="skill 'a': type must be"):
        Skill("a", "x", type="tree")  # type: ignore[arg-type]


# -- item 9 of issue 12: the skills root is confined like the workspace, SKILL.md is capped ---


@pytest.fixture
def outside_skill(tmp_path):
    """A valid skill directory outside the skills root."""
    f = make_skill(tmp_path / "elsewhere", "evil", body="EXFILTRATE-EVERYTHING")
    return f.parent


def test_symlinked_skill_dir_escaping_the_root_is_not_loaded(tmp_path, outside_skill, caplog):
    root = tmp_path / "skills"
    make_skill(root, "good")
    (root / "evil").symlink_to(outside_skill, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.skills"):
        cat = SkillsCatalog.from_dir(root)
    assert [s.name for s in cat] == ["good"]
    assert all("EXFILTRATE" not in s.instructions for s in cat)
    [msg] = [r.getMessage() for r in caplog.records]
    assert str(root / "evil") in msg and "outside the root" in msg


def test_symlinked_skill_md_escaping_the_root_is_not_loaded(tmp_path, outside_skill, caplog):
    root = tmp_path / "skills"
    (root / "evil").mkdir(parents=True)
    (root / "evil" / "SKILL.md").symlink_to("../../elsewhere/evil/SKILL.md")  # relative, climbs out
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.skills"):
        assert len(SkillsCatalog.from_dir(root)) == 0
    [msg] = [r.getMessage() for r in caplog.records]
    assert str(root / "evil" / "SKILL.md") in msg and "outside the root" in msg
    with pytest.raises(ConfigError, match="outside the root"):
        load_skill(root / "evil" / "SKILL.md")


def test_symlinks_that_stay_inside_the_root_are_followed(tmp_path):
    root = tmp_path / "skills"
    make_skill(root / "library", "greet")  # library/ itself has no SKILL.md: not a skill
    (root / "greet").symlink_to("library/greet", target_is_directory=True)
    cat = SkillsCatalog.from_dir(root)
    assert [s.name for s in cat] == ["greet"] and cat.get("greet").instructions == "Do it."


def test_resource_symlink_escaping_the_root_is_not_listed(tmp_path, caplog):
    f = make_skill(tmp_path / "skills", "s")
    (f.parent / "ok.txt").write_text("x")
    (f.parent / "passwd").symlink_to("/etc/passwd")
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.skills"):
        assert SkillsCatalog.from_dir(tmp_path / "skills").get("s").resources == ("ok.txt",)
    assert any(str(f.parent / "passwd") in r.getMessage() for r in caplog.records)


def test_skill_md_over_the_size_cap_is_refused_naming_the_file(tmp_path, caplog):
    from jianmu_fast.skills import DEFAULT_MAX_SKILL_BYTES

    root = tmp_path / "skills"
    f = make_skill(root, "huge")
    with open(f, "r+b") as fh:  # sparse: grows the size without writing the bytes
        fh.truncate(DEFAULT_MAX_SKILL_BYTES + 1)
    make_skill(root, "small")
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.skills"):
        assert [s.name for s in SkillsCatalog.from_dir(root)] == ["small"]
    [msg] = [r.getMessage() for r in caplog.records]
    assert str(f) in msg and f"over the {DEFAULT_MAX_SKILL_BYTES}-byte limit" in msg
    with pytest.raises(ConfigError, match=f"{f}: SKILL.md is {DEFAULT_MAX_SKILL_BYTES + 1} bytes"):
        load_skill(f)
    assert load_skill(f, max_bytes=DEFAULT_MAX_SKILL_BYTES + 1).name == "huge"
    assert SkillsCatalog.from_dir(root, max_bytes=10).skills == []
    with pytest.raises(ValueError, match="max_bytes must be a positive int"):
        SkillsCatalog.from_dir(root, max_bytes=0)


def test_skill_md_that_is_a_fifo_or_hard_link_is_refused(tmp_path, outside_skill):
    import os

    root = tmp_path / "skills"
    (root / "pipe").mkdir(parents=True)
    os.mkfifo(root / "pipe" / "SKILL.md")
    (root / "linked").mkdir()
    os.link(outside_skill / "SKILL.md", root / "linked" / "SKILL.md")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_skill(root / "pipe" / "SKILL.md")
    with pytest.raises(ConfigError, match="hard link"):
        load_skill(root / "linked" / "SKILL.md")


def test_race_swapping_a_skill_dir_for_an_outside_symlink_never_loads_it(tmp_path, outside_skill):
    """A thread swaps skills/greet (a real skill) for a symlink to an outside skill and back
    while the catalog is loaded in a loop: the outside instructions never appear."""
    import os
    import threading
    import time

    root = tmp_path / "skills"
    make_skill(root, "greet", body="inside instructions")
    d, parked = root / "greet", tmp_path / "parked"
    stop = threading.Event()

    def swapper() -> None:
        while not stop.is_set():
            os.rename(d, parked)
            os.symlink(outside_skill, d)
            os.unlink(d)
            os.rename(parked, d)
            time.sleep(0.0002)  # leave the real directory in place now and then

    logging.getLogger("jianmu_fast.skills").disabled = True
    t = threading.Thread(target=swapper)
    t.start()
    loaded = 0
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            for s in SkillsCatalog.from_dir(root):
                assert "EXFILTRATE" not in s.instructions
                loaded += 1
    finally:
        stop.set()
        t.join()
        logging.getLogger("jianmu_fast.skills").disabled = False
    assert loaded > 0
