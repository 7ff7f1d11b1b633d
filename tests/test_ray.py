"""The Ray Data engine (``jianmu_fast.integrations.ray``, ``jianmu-fast build --engine ray``).

Ray binds to the machine's network address unless it has no other, and ``ray stop`` kills by
process name. So the real Ray tests (``tests/ray_cases/``) run in a child process inside a
network namespace that holds only loopback and a PID namespace of their own
(``unshare -n -p -f --mount-proc``, then ``ip link set lo up``): Ray binds to 127.0.0.1, and
stopping it can only touch the processes these tests started. Where those namespaces cannot
be made (not root, no ``unshare``), the test skips and says why.

The callable itself needs no Ray instance and is tested here directly, on both backends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("ray.data", reason="the ray extra is not installed (pip install 'jianmu_fast[ray]')")

ROOT = Path(__file__).resolve().parent.parent


def _namespace_problem() -> str | None:
    if os.environ.get("JIANMU_FAST_PURE_PYTHON") == "1":
        return "the Ray suite runs once, on the compiled backend (the engine is backend-agnostic glue)"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2) to run Ray in a loopback-only namespace"
    probe = subprocess.run(
        ["unshare", "-n", "-p", "-f", "--mount-proc", "sh", "-c", "ip link set lo up"],
        capture_output=True, text=True,
    )
    if probe.returncode != 0:
        return f"cannot create network and PID namespaces here: {probe.stderr.strip() or probe.returncode}"
    return None


def test_ray_engine_in_loopback_namespace():
    """Runs tests/ray_cases/ (local instance and a `ray start --head` cluster) in the namespaces."""
    problem = _namespace_problem()
    if problem:
        pytest.skip(problem)
    short = tempfile.mkdtemp(prefix="jr")  # Ray's socket paths must stay under 108 bytes
    env = dict(os.environ, JIANMU_FAST_RAY_NETNS="1", RAY_USAGE_STATS_ENABLED="0", TMPDIR=short)
    script = 'ip link set lo up && exec "$0" -m pytest -q -x -p no:cacheprovider -p no:logging -o addopts="" tests/ray_cases'
    proc = subprocess.run(
        ["unshare", "-n", "-p", "-f", "--mount-proc", "sh", "-c", script, sys.executable],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    shutil.rmtree(short, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


EXAMPLES = ROOT / "examples" / "conversations.jsonl"
FLAGS = ["--preset", "react", "--max-tokens", "4000", "--tools-desc-file", str(ROOT / "examples" / "tools_desc.txt")]


def test_parquet_input_reads_as_its_jsonl(tmp_path, capsys):
    """A .parquet INPUT (as Arrow stores conversations: message structs with null fields) gives
    the output of the JSONL it was written from, row numbers standing for line numbers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jianmu_fast.cli import main

    lines = [l for l in EXAMPLES.read_text(encoding="utf-8").splitlines() if l.strip()][:40]
    rows = [json.loads(l) for l in lines]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["build", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "a.jsonl"), *FLAGS]) == 0
    assert main(["build", str(tmp_path / "in.parquet"), "-o", str(tmp_path / "b.jsonl"), *FLAGS]) == 0
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    capsys.readouterr()


def test_build_prompts_batch_formats_agree():
    """pyarrow, pandas and dict batches give the same prompts, other columns carried through."""
    import pandas as pd
    import pyarrow as pa

    from jianmu_fast.integrations.ray import BuildPrompts

    rows = [json.loads(l) for l in EXAMPLES.read_text(encoding="utf-8").splitlines()[:12]]
    convs = [r["messages"] if isinstance(r, dict) else r for r in rows]
    spec = {"preset": "react", "max_tokens": 4000, "tokenizer": "o200k_base"}
    fn = BuildPrompts(spec)
    as_dict = fn({"k": list(range(12)), "messages": convs})
    as_pandas = fn(pd.DataFrame({"k": list(range(12)), "messages": convs}))
    as_arrow = fn(pa.Table.from_pylist([{"k": i, "messages": c} for i, c in enumerate(convs)]))
    assert list(as_pandas["k"]) == as_dict["k"] == list(as_arrow["k"]) == list(range(12))
    assert list(as_pandas["messages"]) == as_dict["messages"] == list(as_arrow["messages"])
    assert as_dict["prompt_tokens"] == list(as_arrow["prompt_tokens"])
    assert all(e is None for e in as_dict["error"])


def test_build_prompts_errors():
    from jianmu_fast.errors import BatchError
    from jianmu_fast.integrations.ray import BuildPrompts

    broken = [{"role": "user", "content": "q"},
              {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                    "function": {"name": "f", "arguments": "{}"}}]}]
    good = [{"role": "user", "content": "hi"}]
    skip = BuildPrompts({"tokenizer": "simple"}, on_error="skip", id_column="id")
    out = skip({"id": ["a", "b"], "messages": [good, broken]})
    assert out["error"][0] is None and out["messages"][1] is None
    assert out["error"][1].startswith("ToolCallHistoryError")
    with pytest.raises(BatchError, match="id='b'"):
        BuildPrompts({"tokenizer": "simple"}, id_column="id")({"id": ["a", "b"], "messages": [good, broken]})
    with pytest.raises(KeyError, match="no 'messages' column"):
        skip({"id": [1], "msgs": [good]})
    with pytest.raises(ValueError, match="unknown key 'max_token'"):
        BuildPrompts({"max_token": 10})
    import pickle

    clone = pickle.loads(pickle.dumps(BuildPrompts({"tokenizer": "simple", "max_tokens": 50})))
    assert clone({"messages": [good]})["prompt_tokens"] == [BuildPrompts({"tokenizer": "simple"})({"messages": [good]})["prompt_tokens"][0]]


def test_engine_flag_errors(capsys):
    from jianmu_fast.cli import main

    assert main(["build", str(EXAMPLES), "--ray-address", "127.0.0.1:1"]) == 2
    assert "--ray-address needs --engine ray" in capsys.readouterr().err
