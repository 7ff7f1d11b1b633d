"""BootstrapFilesProvider: rendering, root resolution, confinement, caps, decoding, caching."""

from __future__ import annotations

import json
import logging
import os

import pytest

from jianmu_fast.memory.context import BootstrapFilesProvider, PromptRuntimeContext, RunContext


pytestmark = pytest.mark.usefixtures("config_sandbox_subdir")


@pytest.fixture
def ws(tmp_path):
    d = tmp_path / "ws"
    d.mkdir()
    return d


def content(provider, ctx=None):
    msgs = provider.get_messages({}, None, ctx)
    assert len(msgs) <= 1
    return msgs[0].content if msgs else None


def test_renders_configured_files_in_order_in_one_message(ws):
    (ws / "AGENTS.md").write_text("Use tabs.\n\n")
    (ws / "docs").mkdir()
    (ws / "docs" / "STYLE.md").write_text("Short names.")
    p = BootstrapFilesProvider(files=["docs/STYLE.md", "AGENTS.md"], workspace_dir=ws)
    msgs = p.get_messages({})
    assert [m.role for m in msgs] == ["system"]
    assert msgs[0].content == "## docs/STYLE.md\n\nShort names.\n\n## AGENTS.md\n\nUse tabs."


def test_default_file_list_is_agents_md(ws):
    (ws / "AGENTS.md").write_text("A")
    (ws / "OTHER.md").write_text("B")
    assert content(BootstrapFilesProvider(workspace_dir=ws)) == "## AGENTS.md\n\nA"


def test_file_list_from_config(ws, tmp_path):
    (ws / "AGENTS.md").write_text("A")
    (ws / "README.md").write_text("R")
    (tmp_path / "cwd" / "jianmu.yaml").write_text(f"prompt:\n  bootstrap_files: [README.md, AGENTS.md]\npaths:\n  workspace_dir: {ws}\n")
    assert content(BootstrapFilesProvider()) == "## README.md\n\nR\n\n## AGENTS.md\n\nA"


def test_root_order_argument_then_ctx_then_config_then_cwd(tmp_path):
    roots = {}
    for name in ("arg", "ctx", "conf", "cwd"):
        d = tmp_path / name
        d.mkdir(exist_ok=True)
        (d / "AGENTS.md").write_text(f"from {name}")
        roots[name] = d
    ctx = RunContext(prompt_runtime=PromptRuntimeContext(workspace_dir=str(roots["ctx"])))
    assert content(BootstrapFilesProvider(workspace_dir=roots["arg"]), ctx) == "## AGENTS.md\n\nfrom arg"
    assert content(BootstrapFilesProvider(), ctx) == "## AGENTS.md\n\nfrom ctx"
    assert content(BootstrapFilesProvider(), {"prompt_runtime": ctx.prompt_runtime}) == "## AGENTS.md\n\nfrom ctx"
    assert content(BootstrapFilesProvider()) == "## AGENTS.md\n\nfrom cwd"
    (roots["cwd"] / "jianmu.yaml").write_text(f"paths:\n  workspace_dir: {roots['conf']}\n")
    assert content(BootstrapFilesProvider()) == "## AGENTS.md\n\nfrom conf"


def test_missing_file_is_skipped_with_debug_log(ws, caplog):
    (ws / "AGENTS.md").write_text("A")
    with caplog.at_level(logging.DEBUG, logger="jianmu_fast.context"):
        out = content(BootstrapFilesProvider(files=["NOPE.md", "AGENTS.md"], workspace_dir=ws))
    assert out == "## AGENTS.md\n\nA"
    rec = [r for r in caplog.records if "NOPE.md" in r.getMessage()]
    assert rec and rec[0].levelno == logging.DEBUG and "does not exist" in rec[0].getMessage()


def test_no_files_gives_no_message(ws):
    assert BootstrapFilesProvider(workspace_dir=ws).get_messages({}) == []
    (ws / "AGENTS.md").write_text("  \n\n")
    assert BootstrapFilesProvider(workspace_dir=ws).get_messages({}) == []


@pytest.fixture
def secret(tmp_path):
    s = tmp_path / "secret.txt"
    s.write_text("TOP-SECRET-TOKEN")
    return s


def test_dotdot_path_is_never_read(ws, secret, caplog):
    (ws / "AGENTS.md").write_text("A")
    (ws / "sub").mkdir()
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.context"):
        out = content(BootstrapFilesProvider(files=["../secret.txt", "sub/../../secret.txt", "AGENTS.md"], workspace_dir=ws))
    assert out == "## AGENTS.md\n\nA"
    assert "TOP-SECRET" not in out
    assert sum("'..' is not allowed" in r.getMessage() for r in caplog.records) == 2


def test_absolute_path_outside_is_never_read_inside_is(ws, secret, caplog):
    (ws / "AGENTS.md").write_text("A")
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.context"):
        out = content(BootstrapFilesProvider(files=[str(secret), str(ws / "AGENTS.md")], workspace_dir=ws))
    assert "TOP-SECRET" not in out
    assert out == f"## {ws / 'AGENTS.md'}\n\nA"
    assert any("outside the workspace" in r.getMessage() for r in caplog.records)


def test_symlink_escaping_the_workspace_is_never_read(ws, secret, tmp_path, caplog):
    (ws / "AGENTS.md").symlink_to(secret)
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    (outside_dir / "NOTES.md").write_text("TOP-SECRET-TOO")
    (ws / "linked").symlink_to(outside_dir, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.context"):
        msgs = BootstrapFilesProvider(files=["AGENTS.md", "linked/NOTES.md"], workspace_dir=ws).get_messages({})
    assert msgs == []
    assert sum("outside the workspace" in r.getMessage() for r in caplog.records) == 2


def test_symlink_inside_the_workspace_is_read(ws):
    (ws / "real.md").write_text("inside")
    (ws / "AGENTS.md").symlink_to(ws / "real.md")
    assert content(BootstrapFilesProvider(workspace_dir=ws)) == "## AGENTS.md\n\ninside"


def test_workspace_root_itself_a_symlink(tmp_path, ws):
    (ws / "AGENTS.md").write_text("via link")
    link = tmp_path / "wslink"
    link.symlink_to(ws, target_is_directory=True)
    assert content(BootstrapFilesProvider(workspace_dir=link)) == "## AGENTS.md\n\nvia link"


def test_directory_and_fifo_are_skipped(ws, caplog):
    (ws / "AGENTS.md").mkdir()
    os.mkfifo(ws / "pipe.md")
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.context"):
        assert BootstrapFilesProvider(files=["AGENTS.md", "pipe.md"], workspace_dir=ws).get_messages({}) == []
    assert sum("not a regular file" in r.getMessage() for r in caplog.records) == 2


def test_per_file_cap_with_visible_marker(ws):
    (ws / "AGENTS.md").write_text("x" * 100)
    out = content(BootstrapFilesProvider(workspace_dir=ws, max_bytes=10))
    assert out == (
        "## AGENTS.md\n\nxxxxxxxxxx\n\n"
        "[... truncated: AGENTS.md is 100 bytes; only the first 10 bytes are shown ...]"
    )


def test_cap_never_splits_a_utf8_character(ws):
    (ws / "AGENTS.md").write_text("ab" + "é" * 10, encoding="utf-8")  # é is 2 bytes
    out = content(BootstrapFilesProvider(workspace_dir=ws, max_bytes=5))
    assert out.startswith("## AGENTS.md\n\nabé\n\n[... truncated:")
    assert "\ufffd" not in out


def test_total_cap_truncates_and_names_omitted_files(ws):
    for name in ("A.md", "B.md", "C.md"):
        (ws / name).write_text(name[0] * 30)
    out = content(BootstrapFilesProvider(files=["A.md", "B.md", "C.md"], workspace_dir=ws, max_total_bytes=40))
    assert out == (
        "## A.md\n\n" + "A" * 30 + "\n\n## B.md\n\n" + "B" * 10
        + "\n\n[... truncated: the 40-byte limit for workspace files is reached inside B.md ...]"
        + "\n\n[... truncated: the 40-byte limit for workspace files is reached; not shown: C.md ...]"
    )


def test_bad_utf8_is_replaced(ws):
    (ws / "AGENTS.md").write_bytes(b"ok \xff\xfe end")
    assert content(BootstrapFilesProvider(workspace_dir=ws)) == "## AGENTS.md\n\nok \ufffd\ufffd end"


def test_duplicate_entries_rendered_once(ws):
    (ws / "AGENTS.md").write_text("A")
    assert content(BootstrapFilesProvider(files=["AGENTS.md", "./AGENTS.md"], workspace_dir=ws)) == "## AGENTS.md\n\nA"


def test_cached_until_the_file_changes(ws):
    f = ws / "AGENTS.md"
    f.write_text("v1")
    p = BootstrapFilesProvider(workspace_dir=ws)
    first = p.get_messages({})[0]
    assert p.get_messages({})[0] is first  # same object: nothing re-read or re-rendered
    f.write_text("v2 longer")
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert content(p) == "## AGENTS.md\n\nv2 longer"


def test_deterministic_bytes(ws):
    (ws / "AGENTS.md").write_text("Same.")
    a = [m.to_openai() for m in BootstrapFilesProvider(workspace_dir=ws).get_messages({})]
    b = [m.to_openai() for m in BootstrapFilesProvider(workspace_dir=ws).get_messages({})]
    assert json.dumps(a) == json.dumps(b)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"files": "AGENTS.md"}, TypeError, "files: expected a list"),
        ({"files": ["A.md", 3]}, TypeError, r"files\[1\]"),
        ({"files": ["A.md", ""]}, TypeError, r"files\[1\]"),
        ({"workspace_dir": 3}, TypeError, "workspace_dir"),
        ({"max_bytes": 0}, ValueError, "max_bytes must be a positive int"),
        ({"max_total_bytes": True}, ValueError, "max_total_bytes"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        BootstrapFilesProvider(**kwargs)


# -- item 8 of issue 12: fd-relative opening, no check-then-use gap ---------------------------


def test_symlinks_inside_the_workspace_are_followed_beneath_it(ws):
    (ws / "docs").mkdir()
    (ws / "docs" / "real.md").write_text("deep")
    (ws / "ln").symlink_to("docs", target_is_directory=True)  # relative dir link
    (ws / "docs" / "up.md").symlink_to("../docs/real.md")  # '..' that stays inside
    out = content(BootstrapFilesProvider(files=["ln/real.md"], workspace_dir=ws))
    assert out == "## ln/real.md\n\ndeep"
    assert content(BootstrapFilesProvider(files=["docs/up.md"], workspace_dir=ws)) == "## docs/up.md\n\ndeep"


def test_relative_symlink_climbing_out_is_refused(ws, secret, caplog):
    (ws / "sub").mkdir()
    (ws / "sub" / "AGENTS.md").symlink_to("../../secret.txt")
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.context"):
        assert BootstrapFilesProvider(files=["sub/AGENTS.md"], workspace_dir=ws).get_messages({}) == []
    assert any("'sub/AGENTS.md' skipped" in r.getMessage() for r in caplog.records)


def test_symlink_loop_is_refused(ws, caplog):
    (ws / "AGENTS.md").symlink_to("AGENTS.md")
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.context"):
        assert BootstrapFilesProvider(workspace_dir=ws).get_messages({}) == []
    assert any("symlinks" in r.getMessage() for r in caplog.records)


def test_hard_link_is_refused_with_a_warning_naming_it(ws, secret, caplog):
    os.link(secret, ws / "AGENTS.md")  # same inode as a file outside the workspace
    (ws / "OK.md").write_text("fine")
    with caplog.at_level(logging.WARNING, logger="jianmu_fast.context"):
        out = content(BootstrapFilesProvider(files=["AGENTS.md", "OK.md"], workspace_dir=ws))
    assert out == "## OK.md\n\nfine"
    [rec] = [r for r in caplog.records if "hard link" in r.getMessage()]
    assert "'AGENTS.md'" in rec.getMessage()


def test_race_swapping_a_directory_for_an_outside_symlink_never_leaks(ws, tmp_path):
    """A thread swaps ws/sub (a directory) for a symlink to an outside directory and back,
    while the provider reads sub/NOTES.md in a loop: the outside content never appears."""
    import threading
    import time

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "NOTES.md").write_text("OUTSIDE-SECRET")
    sub = ws / "sub"
    sub.mkdir()
    (sub / "NOTES.md").write_text("inside notes")
    parked = ws / "parked"
    stop = threading.Event()
    swaps = [0]

    def swapper() -> None:
        while not stop.is_set():
            os.rename(sub, parked)
            os.symlink(outside, sub)
            os.unlink(sub)
            os.rename(parked, sub)
            swaps[0] += 1
            time.sleep(0.0002)  # leave the real directory in place now and then

    logging.getLogger("jianmu_fast.context").disabled = True
    t = threading.Thread(target=swapper)
    t.start()
    reads = inside = 0
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            p = BootstrapFilesProvider(files=["sub/NOTES.md"], workspace_dir=ws)  # fresh: no cache
            for m in p.get_messages({}):
                assert "OUTSIDE-SECRET" not in m.content
                inside += 1
            reads += 1
    finally:
        stop.set()
        t.join()
        logging.getLogger("jianmu_fast.context").disabled = False
    assert swaps[0] > 10 and reads > 10
    assert inside > 0  # the inside file was read too: the test exercised real reads
