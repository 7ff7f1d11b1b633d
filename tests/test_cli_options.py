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
    args = cli._parser().parse_args(["build", "-", *flags])
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


def test_tools_file_missing_or_too_big_for_the_budget(tmp_path, capsys):
    assert cli.main(["build", "-", "--tools-file", str(tmp_path / "none.json")]) == 2
    assert "--tools-file" in capsys.readouterr().err
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([tool(i) for i in range(10)]), encoding="utf-8")
    assert cli.main(["build", "-", "--tools-file", str(path), "--max-tokens", "100", "--tokenizer", "simple"]) == 2
    assert "the 10 tools cost" in capsys.readouterr().err
