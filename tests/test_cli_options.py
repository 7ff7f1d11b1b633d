"""The command line's options and messages: flags validated up front, error indices of the
input line, strict JSON out (issue 12 item 3), the tools file (item 6), and the messages a
new user meets (issue 14 item 9)."""

from __future__ import annotations

import json

import pytest

from jianmu_fast import cli
from test_cli import BROKEN_TAIL, SYSTEM, conversation, read_jsonl, write_jsonl


def build(tmp_path, rows, *flags):
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    return cli.main(["build", src, "-o", str(out), "--tokenizer", "simple", *flags]), out


# -- issue 12 item 3 ----------------------------------------------------------------------------


def test_error_indices_count_the_input_line_not_the_injected_prompt(tmp_path, capsys):
    big = [SYSTEM, {"role": "user", "content": "word " * 400}]
    rc, _ = build(tmp_path, [{"messages": BROKEN_TAIL}, {"messages": big}], "--on-error", "skip",
                  "--max-tokens", "300")
    assert rc == 0
    err = capsys.readouterr().err
    # BROKEN_TAIL = [system, user, assistant(call x1)]: the broken call is the input's messages[2]
    assert "in.jsonl:1: ToolCallHistoryError: messages[2] (role='assistant', tool_call ids=['x1'])" in err
    # the pinned prefix: the preset's persona, then the input's own system message
    assert ("in.jsonl:2: ContextBudgetError: TokenBudgetFilter: the pinned prefix, prompt messages[0:2] "
            "(1 added by the preset, input messages[0]), needs") in err
    assert "the newest unit, messages[1:2] (user), needs" in err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-tokens", "99999999999999999999999", "expected an integer from 1 to 1,000,000,000"),
        ("--max-tokens", "1000000001", "expected an integer from 1 to 1,000,000,000, got '1000000001'"),
        ("--max-tokens", "1e3", "expected an integer from 1 to 1,000,000,000, got '1e3'"),
        ("--max-messages", "-1", "expected an integer from 1 to 1,000,000,000, got '-1'"),
        ("--workers", "100000", "expected an integer from 1 to 256, got '100000'"),
    ],
)
def test_flags_are_validated_up_front(flag, value, message, capsys):
    assert cli.main(["build", "-", flag, value]) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {message}" in err
    assert "Traceback" not in err and "OverflowError" not in err


def test_largest_budget_is_accepted(tmp_path):
    rc, out = build(tmp_path, [conversation(2)], "--max-tokens", "1000000000", "--max-messages", "1000000000")
    assert rc == 0
    assert read_jsonl(out)[0]["dropped"]["messages"] == 0


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"messages": [], "score": NaN}', "not strict JSON: NaN (JSON has no NaN or Infinity"),
        ('{"messages": [], "score": Infinity}', "not strict JSON: Infinity"),
        ('{"messages": [], "score": -Infinity}', "not strict JSON: -Infinity"),
        ('{"messages": [], "score": 1e999}', "not strict JSON: the number 1e999 is out of range"),
    ],
)
def test_non_finite_numbers_refuse_the_line(tmp_path, capsys, text, reason):
    rc, out = build(tmp_path, [conversation(1), text, conversation(1)], "--on-error", "skip")
    assert rc == 0
    assert f"in.jsonl:2: {reason}" in capsys.readouterr().err
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    for line in lines:
        json.loads(line, parse_constant=pytest.fail)  # strict JSON


def test_help_says_how_non_finite_numbers_and_ranges_are_handled(capsys):
    assert cli.main(["build", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "NaN, Infinity or a number out of range is refused" in text
    assert "(1 to 1,000,000,000)" in text
