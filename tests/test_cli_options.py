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
                  "--max-tokens", "300", "--preset", "react", "--system-prompt", "Be brief.")
    assert rc == 0
    err = capsys.readouterr().err
    # the pinned prefix: --system-prompt and the react protocol (the input's system message is replaced)
    assert ("in.jsonl:2: ContextBudgetError: TokenBudgetFilter: the pinned prefix, prompt messages[0:2] "
            "(2 added by the preset), needs") in err
    assert "the newest unit, messages[1:2] (user), needs" in err
    rc, _ = build(tmp_path, [{"messages": BROKEN_TAIL}], "--on-error", "skip")
    # BROKEN_TAIL = [system, user, assistant(call x1)]: the broken call is the input's messages[2]
    assert "in.jsonl:1: ToolCallHistoryError: messages[2] (role='assistant', tool_call ids=['x1'])" in \
        capsys.readouterr().err


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


# -- issue 12 item 6: --tools-file --------------------------------------------------------------


def tool(i: int) -> dict:
    return {"type": "function", "function": {
        "name": f"lookup_{i}", "description": "Look something up in the catalogue. " * 3,
        "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "the query"}},
                       "required": ["q"]}}}


def core_budgets_tools() -> bool:
    from jianmu_fast.errors import ContextBudgetError
    from jianmu_fast.memory.context import SimpleTokenCounter, TokenBudgetFilter
    from jianmu_fast.message import human

    try:
        TokenBudgetFilter(50, counter=SimpleTokenCounter()).apply([human("hi")], tools_schema=[tool(0)] * 10)
    except ContextBudgetError:
        return True
    return False


def test_tools_file_reaches_the_builder_and_the_budget(tmp_path, capsys):
    from jianmu_fast.batch import build_batch
    from jianmu_fast.memory.context import SimpleTokenCounter
    from jianmu_fast.message import coerce_messages

    tools = [tool(i) for i in range(10)]
    (tmp_path / "tools.json").write_text(json.dumps(tools), encoding="utf-8")
    rows = [conversation(k)[1:] for k in (1, 5, 20)]  # no system message: the preset's persona
    flags = ["--max-tokens", "2000", "--preset", "react"]
    rc, out = build(tmp_path, rows, "--tools-file", str(tmp_path / "tools.json"), *flags)
    assert rc == 0
    err = capsys.readouterr().err
    counter = SimpleTokenCounter()
    cost = counter.count_tools(tools)
    assert f"tools: 10 from {tmp_path / 'tools.json'}, {cost} tokens per request, inside --max-tokens" in err
    got = read_jsonl(out)
    args = cli.make_parser().parse_args(["build", "-", *flags])
    builder = cli.make_builder(args, counter)
    expected = build_batch(builder, [{"messages": coerce_messages(r)} for r in rows], tools_schema=tools)
    assert [g["messages"] for g in got] == [[m.to_openai() for m in p] for p in expected]
    if not core_budgets_tools():
        pytest.xfail("the filters do not count tools_schema yet (issue 12 item 6, core part)")
    assert all(g["prompt_tokens"] + cost <= 2000 for g in got)
    assert got[2]["dropped"]["messages"] > 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[{", "not JSON: Expecting property name enclosed in double quotes at line 1 column 3"),
        ('{"tools": []}', "expected a JSON list of tools, got an object"),
        ('[{"type": "function", "function": {"name": "a"}}, 3]', 'tools[1]: expected an object {"type": "function"'),
        ('[{"function": {"name": "a"}}]', 'tools[0].type: expected "function", got null'),
        ('[{"type": "function"}]', "tools[0].function: expected an object with a name, got null"),
        ('[{"type": "function", "function": {"name": 7}}]', "tools[0].function.name: expected a non-empty string"),
        ('[{"type": "function", "function": {"name": "a", "parameters": []}}]',
         "tools[0].function.parameters: expected an object, got a list"),
        ('[{"type": "function", "function": {"name": "a", "x": NaN}}]', "not strict JSON: NaN"),
    ],
)
def test_bad_tools_file_is_a_usage_error(tmp_path, capsys, content, message):
    path = tmp_path / "tools.json"
    path.write_text(content, encoding="utf-8")
    assert cli.main(["build", "-", "--tools-file", str(path)]) == 2
    assert f"error: --tools-file {str(path)!r}: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--tools-file", "--tools-desc-file", "--system-prompt-file"])
def test_a_file_flag_that_is_not_utf8_is_a_usage_error(tmp_path, capsys, flag):
    path = tmp_path / "f.txt"
    path.write_bytes(b"ok \xff")
    assert cli.main(["build", "-", "--preset", "react", flag, str(path)]) == 2
    assert f"error: {flag} {str(path)!r}: not UTF-8: byte 0xff at offset 3" in capsys.readouterr().err


def test_tools_file_missing_or_too_big_for_the_budget(tmp_path, capsys):
    assert cli.main(["build", "-", "--tools-file", str(tmp_path / "none.json")]) == 2
    assert "--tools-file" in capsys.readouterr().err
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([tool(i) for i in range(10)]), encoding="utf-8")
    assert cli.main(["build", "-", "--tools-file", str(path), "--max-tokens", "100", "--tokenizer", "simple"]) == 2
    assert "the 10 tools cost" in capsys.readouterr().err


# -- issue 14 item 9: what a new user meets -----------------------------------------------------


def test_version(capsys):
    from jianmu_fast import BACKEND, __version__

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"jianmu-fast {__version__} (backend {BACKEND})"


def broken_history(i: int) -> list[dict]:
    """A history whose assistant message 1 has a call with no result, then a new user turn."""
    return [{"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"lost{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "user", "content": "still there?"}]


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_sanitize_warnings_carry_file_and_line(tmp_path, capsys, on_error):
    rows = [conversation(1), broken_history(2), "{bad", broken_history(4)]
    rc, out = build(tmp_path, rows, "--on-error", on_error)
    err = capsys.readouterr().err
    assert "in.jsonl:2: warning: left out a broken tool-call unit, messages[1]: call(s) ['lost2'] have no result" in err
    assert "in.jsonl:3: not JSON" in err
    assert "WARNING jianmu_fast" not in err  # no unattributed copy of the warning
    if on_error == "raise":
        assert rc == 1 and ":4:" not in err  # nothing about lines after the failing one
        assert len(read_jsonl(out)) == 2
    else:
        assert rc == 0 and "in.jsonl:4: warning: left out a broken tool-call unit, messages[1]" in err
        got = read_jsonl(out)
        assert got[1]["dropped"]["indices"] == [1]
        assert [m["role"] for m in got[1]["messages"]][-2:] == ["user", "user"]


def test_unknown_tokenizer_lists_every_accepted_form(capsys):
    assert cli.main(["build", "-", "--tokenizer", "gpt-99"]) == 2
    err = capsys.readouterr().err
    assert "error: --tokenizer 'gpt-99': " in err and "--tokenizer accepts:" in err
    for form, what in cli.TOKENIZER_FORMS:
        assert f"  {form}: {what}" in err
    assert "simple" in err and "encoding or model name" in err and "tokenizer.json" in err


def test_summary_says_nothing_was_trimmed_without_limits(tmp_path, config_sandbox, capsys):
    rc, _ = build(tmp_path, [conversation(30)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "nothing trimmed (no --max-tokens or --max-messages)" in err and "dropped" not in err
    build(tmp_path, [conversation(30)], "--max-messages", "4")
    assert "nothing trimmed" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("--max_tokens", "--max-tokens"), ("--max-tok", "--max-tokens"), ("--on_error", "--on-error"),
     ("--tokeniser", "--tokenizer"), ("--system_prompt=x", "--system-prompt")],
)
def test_misspelt_flag_suggests_the_right_one(capsys, typed, meant):
    assert cli.main(["build", "-", typed, "5"] if "=" not in typed else ["build", "-", typed]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err
    assert f"{typed.split('=')[0]}: did you mean {meant}?" in err


def test_make_run_says_what_the_first_install_does(tmp_path):
    import os
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(["make", "-n", "run", f"VENV={tmp_path / 'venv'}"], cwd=root, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    pip = next(i for i, line in enumerate(lines) if "pip install" in line)
    assert any(line.startswith("echo ") and "Installing" in line for line in lines[:pip])
