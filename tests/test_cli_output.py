"""Issue 12 item 1: the command line never destroys its input or a previous output, and never
writes part of a line (SIGINT included)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from jianmu_fast import cli
from test_cli import conversation, read_jsonl, write_jsonl

BAD = "{not json"


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("how", ["same path", "symlink", "hard link", "relative path"])
def test_output_that_is_the_input_is_refused(tmp_path, capsys, monkeypatch, how):
    src = write_jsonl(tmp_path / "in.jsonl", [conversation(1), conversation(2)])
    before = (tmp_path / "in.jsonl").read_bytes()
    out = str(tmp_path / "out.jsonl")
    if how == "same path":
        out = src
    elif how == "symlink":
        os.symlink(src, out)
    elif how == "hard link":
        os.link(src, out)
    else:
        monkeypatch.chdir(tmp_path)
        out = "./sub/../in.jsonl"
        (tmp_path / "sub").mkdir()
    assert cli.main(["build", src, "-o", out, "--tokenizer", "simple"]) == 2
    err = capsys.readouterr().err
    assert f"error: -o {out!r} is the same file as the input {src!r}" in err
    assert "would destroy the input" in err
    assert (tmp_path / "in.jsonl").read_bytes() == before
    assert leftovers(tmp_path) == []


def test_stdin_redirected_from_the_output_is_refused(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [conversation(1)])
    before = (tmp_path / "in.jsonl").read_bytes()
    with open(src, "rb") as f:
        r = subprocess.run([sys.executable, "-m", "jianmu_fast", "build", "-", "-o", src], stdin=f,
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "is the same file as standard input" in r.stderr
    assert (tmp_path / "in.jsonl").read_bytes() == before


def test_raise_keeps_earlier_lines_and_the_previous_permissions(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [conversation(1), conversation(2), BAD, conversation(3)])
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    os.chmod(out, 0o640)
    assert cli.main(["build", src, "-o", str(out), "--tokenizer", "simple"]) == 1
    assert len(read_jsonl(out)) == 2
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert leftovers(tmp_path) == []


def test_new_file_gets_the_umask_mode(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [conversation(1)])
    mask = os.umask(0o027)
    try:
        assert cli.main(["build", src, "-o", str(tmp_path / "new.jsonl"), "--tokenizer", "simple"]) == 0
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "new.jsonl").stat().st_mode) == 0o640


def test_symlink_output_is_written_through(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [conversation(1)])
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "prompts.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    os.symlink(target, link)
    assert cli.main(["build", src, "-o", str(link), "--tokenizer", "simple"]) == 0
    assert link.is_symlink()
    assert len(read_jsonl(target)) == 1
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "real") == []


def test_device_output_and_missing_directory(tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [conversation(1)])
    assert cli.main(["build", src, "-o", os.devnull, "--tokenizer", "simple"]) == 0
    capsys.readouterr()
    assert cli.main(["build", src, "-o", str(tmp_path / "nope" / "o.jsonl"), "--tokenizer", "simple"]) == 2
    assert "cannot create a file in" in capsys.readouterr().err


# -- SIGINT: subprocesses ---------------------------------------------------------------------


def big_input(tmp_path, n=30000):
    line = json.dumps({"messages": conversation(1)}) + "\n"
    path = tmp_path / "big.jsonl"
    path.write_text(line * n, encoding="utf-8")
    return str(path)


def _default_sigint() -> None:
    # a suite started in the background of a non-interactive shell inherits SIGINT ignored, and
    # Python then leaves it ignored in the child: these tests need Ctrl-C's default behaviour
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "jianmu_fast", "build", *args, "--tokenizer", "simple"],
                            stderr=subprocess.PIPE, preexec_fn=_default_sigint, **kw)


def test_sigint_on_stdout_writes_only_whole_lines(tmp_path):
    proc = start([big_input(tmp_path)], stdout=subprocess.PIPE)
    first = os.read(proc.stdout.fileno(), 1)  # the first chunk is out: the run is in the middle
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    data = first + rest
    assert data.endswith(b"\n")
    lines = data.decode("utf-8").splitlines()
    assert 0 < len(lines) < 30000
    assert all(json.loads(line)["prompt_tokens"] > 0 for line in lines)


def test_sigint_keeps_the_previous_output_file(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("previous good output\n")
    proc = start([big_input(tmp_path), "-o", str(out)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size for p in tmp_path.glob(".out.jsonl.*.tmp")):  # a chunk is written
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 130, err
    assert out.read_text() == "previous good output\n"
    assert leftovers(tmp_path) == []
