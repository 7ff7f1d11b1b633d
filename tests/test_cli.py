"""The ``jianmu-fast`` command line, end to end: subprocesses on files, stdin/stdout, bad lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jianmu_fast import cli
from jianmu_fast.memory.context import TiktokenTokenCounter
from jianmu_fast.message import coerce_messages

SCRIPT = os.path.join(os.path.dirname(sys.executable), "jianmu-fast")

SYSTEM = {"role": "system", "content": "You are a travel agent."}


def call(cid, name="get_weather", args='{"city": "Paris"}'):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def conversation(k: int) -> list[dict]:
    """k episodes: a user turn, a tool round and an answer each (4 messages per episode)."""
    out = [SYSTEM]
    for i in range(k):
        out += [
            {"role": "user", "content": f"Weather in city {i}? " + "please " * 20},
            {"role": "assistant", "content": None, "tool_calls": [call(f"c{i}")]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": json.dumps({"temp": i, "sky": "clear " * 30})},
            {"role": "assistant", "content": f"It is {i} degrees and clear. " * 5},
        ]
    return out


BROKEN_TAIL = [SYSTEM, {"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [call("x1")]}]
TOO_BIG = [SYSTEM, {"role": "user", "content": "word " * 3000}]


def run(*args, stdin=None, cwd=None):
    return subprocess.run([SCRIPT, *args], input=stdin, capture_output=True, text=True, cwd=cwd, timeout=120)


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def script_exists():
    if not os.path.exists(SCRIPT):
        pytest.skip("the jianmu-fast console script is not installed (pip install -e .)")


def test_build_file_to_file(tmp_path, script_exists):
    rows = [{"id": "a", "messages": conversation(3), "meta": {"k": 1}}, conversation(40)]
    out = tmp_path / "out.jsonl"
    r = run("build", write_jsonl(tmp_path / "in.jsonl", rows), "-o", str(out), "--max-tokens", "1000",
            "--system-prompt", "Be brief.")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    got = read_jsonl(out)
    assert [g.get("id") for g in got] == ["a", None]
    assert got[0]["meta"] == {"k": 1}  # other keys carried through
    counter = TiktokenTokenCounter("o200k_base")
    for g, row in zip(got, rows):
        prompt = coerce_messages(g["messages"])
        assert g["prompt_tokens"] == counter.count_messages(prompt) <= 1000
        assert prompt[0].content == "Be brief."
        history = row["messages"] if isinstance(row, dict) else row
        assert g["dropped"]["messages"] == len(g["dropped"]["indices"])
        assert all(0 <= i < len(history) for i in g["dropped"]["indices"])
    assert got[0]["dropped"] == {"messages": 0, "tokens": 0, "indices": []}
    dropped = got[1]["dropped"]
    assert dropped["messages"] > 100 and dropped["indices"][0] == 1 and dropped["tokens"] > 4000
    assert "2 prompts written, 0 lines failed" in r.stderr
    assert "p50" in r.stderr and "p95" in r.stderr and "backend" in r.stderr


def test_stdin_to_stdout_and_python_m(tmp_path):
    data = json.dumps(conversation(2)) + "\n\n" + json.dumps({"messages": conversation(1)}) + "\n"
    r = subprocess.run([sys.executable, "-m", "jianmu_fast", "build", "-", "--tokenizer", "simple",
                        "--max-messages", "3"], input=data, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2  # the blank line is ignored
    first = json.loads(lines[0])
    # the conversation's own system message (the persona), then 3 non-pinned messages
    assert [m["role"] for m in first["messages"]][-3:] == ["assistant", "tool", "assistant"]
    assert first["dropped"]["indices"] == [1, 2, 3, 4, 5]


def test_bad_lines_raise_stops_at_the_first(tmp_path, script_exists):
    rows = [conversation(1), "{not json", {"messages": BROKEN_TAIL}, conversation(2)]
    out = tmp_path / "out.jsonl"
    r = run("build", write_jsonl(tmp_path / "in.jsonl", rows), "-o", str(out), "--tokenizer", "simple")
    assert r.returncode == 1
    assert len(read_jsonl(out)) == 1  # the line before the bad one, nothing after
    assert "in.jsonl:2: not JSON: Expecting property name enclosed in double quotes at column 2" in r.stderr
    assert ":3:" not in r.stderr  # stopped at line 2
    assert "1 prompt written, 1 line failed" in r.stderr


def test_bad_lines_skip_writes_the_others(tmp_path, script_exists):
    rows = [
        conversation(1),                                   # 1 ok
        "{not json",                                       # 2 not JSON
        {"messages": BROKEN_TAIL},                         # 3 broken tool-call tail
        {"conversation": []},                              # 4 not a conversation
        [{"role": "robot", "content": "x"}],               # 5 bad message
        {"messages": TOO_BIG},                             # 6 cannot fit
        conversation(2),                                   # 7 ok
        "42",                                              # 8 not a conversation
    ]
    out = tmp_path / "out.jsonl"
    r = run("build", write_jsonl(tmp_path / "in.jsonl", rows), "-o", str(out), "--on-error", "skip",
            "--max-tokens", "500")
    assert r.returncode == 0, r.stderr
    got = read_jsonl(out)
    assert [len(g["messages"]) for g in got] == [6, 10]  # the input's persona, semantics note, the rest
    err = r.stderr
    assert "in.jsonl:2: not JSON" in err
    assert "in.jsonl:3: ToolCallHistoryError: messages[" in err and "'x1'" in err
    assert "in.jsonl:4: not a conversation: an object needs a 'messages' list" in err
    assert "in.jsonl:5: MessageValidationError: messages[0].role: Input should be" in err
    assert "in.jsonl:6: ContextBudgetError: TokenBudgetFilter" in err
    assert "in.jsonl:8: not a conversation: expected an object or a list, got int" in err
    assert ":1:" not in err and ":7:" not in err
    assert "2 prompts written, 6 lines failed" in err


def test_build_errors_raise_exit_1_after_earlier_prompts(tmp_path, script_exists):
    rows = [conversation(1), conversation(1), {"messages": TOO_BIG}, conversation(1)]
    out = tmp_path / "out.jsonl"
    r = run("build", write_jsonl(tmp_path / "in.jsonl", rows), "-o", str(out), "--max-tokens", "500")
    assert r.returncode == 1
    assert len(read_jsonl(out)) == 2
    assert "in.jsonl:3: ContextBudgetError" in r.stderr


def test_presets_and_files(tmp_path, script_exists):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "AGENTS.md").write_text("Always answer in French.", encoding="utf-8")
    (tmp_path / "tools.txt").write_text("- get_weather(city): the forecast", encoding="utf-8")
    (tmp_path / "sys.txt").write_text("You are Jianmu.", encoding="utf-8")
    skills = tmp_path / "skills" / "greet"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text("---\nname: greet\ndescription: Say hello nicely.\n---\nWave.\n",
                                     encoding="utf-8")
    src = write_jsonl(tmp_path / "in.jsonl", [conversation(1)])
    r = run("build", src, "-o", str(tmp_path / "react.jsonl"), "--preset", "react", "--tools-desc-file",
            str(tmp_path / "tools.txt"), "--system-prompt-file", str(tmp_path / "sys.txt"),
            "--workspace-dir", str(tmp_path / "ws"))
    assert r.returncode == 0, r.stderr
    text = [m["content"] for m in read_jsonl(tmp_path / "react.jsonl")[0]["messages"] if m["role"] == "system"]
    assert text[0] == "You are Jianmu."
    assert any("get_weather(city)" in t for t in text)
    assert any("Always answer in French." in t for t in text)
    r = run("build", src, "-o", str(tmp_path / "skill.jsonl"), "--preset", "skill", "--skills-dir",
            str(tmp_path / "skills"))
    assert r.returncode == 0, r.stderr
    assert "greet" in json.dumps(read_jsonl(tmp_path / "skill.jsonl")[0]["messages"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build", "missing.jsonl"], "error: INPUT 'missing.jsonl': No such file or directory"),
        (["build", "-", "--skills-dir", "."], "error: --skills-dir needs --preset skill"),
        (["build", "-", "--tokenizer", "no_such_encoding"], "error: "),
        (["build", "-", "--tokenizer", "missing/tokenizer.json"], "no such tokenizer.json file"),
        (["build", "-", "--max-tokens", "0"], "expected an integer from 1 to 1,000,000,000, got '0'"),
        (["build", "-", "--on-error", "ignore"], "invalid choice: 'ignore'"),
        (["build", "-", "--system-prompt", "a", "--system-prompt-file", "b"], "not allowed with argument"),
    ],
)
def test_usage_errors_exit_2(args, message, capsys):
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err


def test_hf_tokenizer_path(tmp_path, capsys, monkeypatch):
    path = os.path.join(os.path.dirname(__file__), "data", "all-MiniLM-L6-v2.tokenizer.json")
    src = write_jsonl(tmp_path / "in.jsonl", [conversation(1)])
    assert cli.main(["build", src, "-o", str(tmp_path / "o.jsonl"), "--tokenizer", path]) == 0
    assert read_jsonl(tmp_path / "o.jsonl")[0]["prompt_tokens"] > 0


def test_workers(tmp_path):
    rows = [conversation(k) for k in range(1, 9)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    assert cli.main(["build", src, "-o", str(tmp_path / "one.jsonl"), "--max-tokens", "800"]) == 0
    assert cli.main(["build", src, "-o", str(tmp_path / "two.jsonl"), "--max-tokens", "800", "--workers", "2"]) == 0
    assert (tmp_path / "one.jsonl").read_text() == (tmp_path / "two.jsonl").read_text()


def test_summary_percentiles():
    assert "p50 0, p95 0" in cli.summarize([], 0, 0, 0.0)
    assert "p50 50, p95 95" in cli.summarize(list(range(1, 101)), 0, 0, 1.0)


def test_names_of_the_single_module_cli_still_import():
    """``jianmu_fast.cli`` is a package now: every name code imported from the old module still
    imports from it, ``UsageError`` keeps its name, and ``python -m jianmu_fast.cli`` runs."""
    import subprocess
    import sys

    old = ["main", "make_counter", "make_builder", "load_tools", "InputPersonaProvider", "split_persona", "summarize",
           "spec_namespace", "process_conversations", "ConversationResult", "UsageError", "TOKENIZER_FORMS", "PROG",
           "MAX_LIMIT", "MAX_WORKERS", "_parser", "_drop_nulls", "_read_text", "_Job", "_process", "_CHUNK"]
    assert [n for n in old if not hasattr(cli, n)] == []
    assert f"{cli.UsageError.__module__}.{cli.UsageError.__qualname__}" == "jianmu_fast.cli.UsageError"
    assert cli._parser is cli.make_parser and cli._drop_nulls([{"a": None}]) == [{}]
    got = subprocess.run([sys.executable, "-m", "jianmu_fast.cli", "--version"], capture_output=True, text=True)
    assert got.returncode == 0 and got.stdout.startswith("jianmu-fast "), got
