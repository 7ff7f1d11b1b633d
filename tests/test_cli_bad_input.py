"""Issue 12 item 2: whatever one line's content makes fail is that line's error
(``FILE:LINE: reason``), never the run's; under ``--on-error skip`` the good lines come out."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import tempfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jianmu_fast import cli
from test_cli import conversation, read_jsonl

MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "300"))
FLAGS = ["--tokenizer", "simple", "--max-messages", "3", "--on-error", "skip"]


def good(k: int, tag: str = "g") -> bytes:
    return json.dumps({"id": f"{tag}{k}", "messages": conversation(k)}).encode()


def run_lines(directory: str, name: str, lines: list[bytes], *flags: str) -> tuple[int, bytes, str]:
    """``cli.main`` on a file of ``lines``: (exit status, output bytes, stderr)."""
    src, out = os.path.join(directory, name), os.path.join(directory, name + ".out")
    with open(src, "wb") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli.main(["build", src, "-o", out, *(flags or FLAGS)])
    with open(out, "rb") as f:
        return rc, f.read(), err.getvalue()


SURROGATE = b'{"messages": [{"role": "user", "content": "hi \\ud800 there"}]}'
BAD_UTF8 = b'{"messages": [{"role": "user", "content": "caf\xc3 \xff"}]}'
DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_CONTENT = (b'{"messages": [{"role": "user", "content": "x"}], "meta": ' + b"[" * 5000 + b"]" * 5000 + b"}")
LONE_IN_KEY = b'{"messages": [{"role": "user", "content": "x"}], "meta": {"\\udc80": 1}}'


def test_bad_lines_are_line_errors_and_good_lines_come_out(tmp_path):
    lines = [good(1), SURROGATE, good(2), BAD_UTF8, DEEP, DEEP_CONTENT, LONE_IN_KEY, good(3)]
    rc, out, err = run_lines(str(tmp_path), "in.jsonl", lines)
    assert rc == 0, err
    assert [json.loads(x)["id"] for x in out.splitlines()] == ["g1", "g2", "g3"]
    assert "Traceback" not in err
    src = str(tmp_path / "in.jsonl")
    assert f"{src}:2: messages[0].content: a lone surrogate \\ud800 (half of a UTF-16 pair) is not valid Unicode" in err
    assert f"{src}:4: not UTF-8: byte 0xc3 at column 47 (invalid continuation byte)" in err
    assert f"{src}:5: JSON nested too deeply to read" in err
    assert f"{src}:6: " in err
    assert f"{src}:7: meta: a key with a lone surrogate \\udc80" in err
    assert "3 prompts written, 5 lines failed" in err


def test_raise_stops_at_an_undecodable_line(tmp_path):
    rc, out, err = run_lines(str(tmp_path), "in.jsonl", [good(1), BAD_UTF8, good(2)],
                             "--tokenizer", "simple")
    assert rc == 1
    assert len(out.splitlines()) == 1
    assert ":2: not UTF-8" in err and ":3:" not in err


def test_a_bom_on_the_first_line_is_read(tmp_path):
    rc, out, err = run_lines(str(tmp_path), "in.jsonl", [b"\xef\xbb\xbf" + good(1), good(2)])
    assert rc == 0, err
    assert len(out.splitlines()) == 2


def test_stdin_bytes_are_decoded_per_line(tmp_path):
    import subprocess
    import sys

    data = good(1) + b"\n" + BAD_UTF8 + b"\n" + good(2) + b"\n"
    r = subprocess.run([sys.executable, "-m", "jianmu_fast", "build", "-", *FLAGS], input=data,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2
    assert b"<stdin>:2: not UTF-8" in r.stderr


# -- fuzz: random bytes and random JSON mixed with good lines ---------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
role = st.sampled_from(["system", "user", "assistant", "tool", "robot"])
messages = st.lists(st.fixed_dictionaries({"role": role, "content": st.text(max_size=40) | json_values}), max_size=5)


@st.composite
def random_line(draw) -> bytes:
    kind = draw(st.sampled_from(["bytes", "json", "conversation", "surrogate", "deep", "good"]))
    if kind == "bytes":  # (a byte order mark is read only at the start of the file)
        return draw(st.binary(max_size=60).filter(lambda b: not b.startswith(b"\xef\xbb\xbf"))).replace(b"\n", b" ")
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    if kind == "conversation":
        return json.dumps({"messages": draw(messages)}).encode()
    if kind == "surrogate":
        cp = draw(st.integers(0xD800, 0xDFFF))
        text = json.dumps({"messages": [{"role": "user", "content": f"x{chr(cp)}y"}]}, ensure_ascii=True)
        return text.encode()
    if kind == "deep":
        n = draw(st.integers(500, 5000))
        return b'{"messages": [{"role": "user", "content": ' + b"[" * n + b"]" * n + b"}]}"
    return good(draw(st.integers(0, 3)), tag=f"t{draw(st.integers(0, 99))}-")


@settings(deadline=None, max_examples=min(MAX_EXAMPLES, 60))
@given(st.lists(random_line(), min_size=1, max_size=8), st.randoms(use_true_random=False))
@example(  # one line, two warnings (two broken tool-call units): reported twice, as alone
    [b'{"messages": [{"role": "tool", "content": ""}, {"role": "system", "content": ""}, '
     b'{"role": "tool", "content": ""}, {"role": "user", "content": ""}]}'], random.Random(0))
def test_fuzz_every_line_is_built_as_alone_or_reported(lines, rnd):
    """The mixed file's output is the concatenation of what each line gives alone; the lines
    reported are exactly those that fail alone, each with its own line number."""
    goods = [good(k, tag="known") for k in range(3)]
    for g in goods:
        lines.insert(rnd.randrange(len(lines) + 1), g)
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = run_lines(d, "mixed.jsonl", lines)
        assert rc == 0 and "Traceback" not in err, err
        expected, failing = [], []
        for i, line in enumerate(lines, 1):
            alone_rc, alone_out, alone_err = run_lines(d, f"alone{i}.jsonl", [line])
            assert alone_rc == 0 and "Traceback" not in alone_err, alone_err
            expected.append(alone_out)
            # every error and warning the line gives alone (a line may give several: one per
            # broken tool-call unit), reported for it in the mixed file under its own number
            reasons = [x.split(".jsonl:1: ", 1)[1] for x in alone_err.splitlines() if ".jsonl:1: " in x]
            for reason in reasons:
                assert f"mixed.jsonl:{i}: {reason}" in err
            failing += [i] * len(reasons)
        assert out == b"".join(expected)
        reported = sorted(int(x.split(":", 2)[0]) for x in err.split("mixed.jsonl:")[1:])
        assert reported == failing
        for g in goods:  # the known good lines always come out
            assert json.loads(g)["id"].encode() in out


def test_fuzz_output_is_strict_utf8_json(tmp_path):
    rc, out, err = run_lines(str(tmp_path), "in.jsonl", [good(2), SURROGATE, good(1)])
    for line in out.decode("utf-8").splitlines():
        json.loads(line, parse_constant=pytest.fail)
