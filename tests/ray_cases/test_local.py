"""A local Ray instance (num_cpus=2): the Ray path equals build_batch and per-state build()."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import ray
import ray.data

from jianmu_fast.batch import build_batch
from jianmu_fast.cli import main, split_persona
from jianmu_fast.integrations.ray import BuildPrompts, _strip_none, build_dataset, builder_from_spec
from jianmu_fast.message import coerce_messages

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "conversations.jsonl"
SPEC = {"preset": "react", "max_tokens": 4000, "tokenizer": "o200k_base",
        "tools_desc_file": str(ROOT / "examples" / "tools_desc.txt")}


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    yield
    ray.shutdown()


def _conversations(limit=120):
    rows = []
    for line in EXAMPLES.read_text(encoding="utf-8").splitlines()[:limit]:
        obj = json.loads(line)
        rows.append(obj["messages"] if isinstance(obj, dict) else obj)
    return rows


def _normal(prompt):
    # rows read back from Ray's Arrow blocks carry the union of the message structs' fields,
    # unset ones as None: the same messages once those are left out
    return [m.to_openai() for m in coerce_messages(_strip_none(list(prompt)))]


def test_dataset_equals_build_batch_and_build():
    convs = _conversations()
    ds = ray.data.from_items([{"id": i, "messages": c, "tag": f"t{i}"} for i, c in enumerate(convs)])
    rows = build_dataset(ds, SPEC, batch_size=16, compute=ray.data.ActorPoolStrategy(size=2)).take_all()
    assert [r["id"] for r in rows] == list(range(len(convs)))  # input order, each row once
    assert [r["tag"] for r in rows] == [f"t{i}" for i in range(len(convs))]  # other columns carried
    builder, counter, _, _ = builder_from_spec(SPEC)
    local = BuildPrompts(SPEC).build_rows(convs)
    # the states as the command line makes them: the input's leading system messages are the persona
    states = []
    for c in convs:
        persona, history = split_persona(coerce_messages(c))
        states.append({"messages": history, "persona": persona})
    batch = build_batch(builder, states)
    for r, want, b, state in zip(rows, local["messages"], batch, states):
        assert r["error"] is None
        assert _normal(r["messages"]) == _normal(want)
        assert _normal(r["messages"]) == _normal(b) == _normal(builder.build(state))
        assert r["prompt_tokens"] == counter.count_messages(coerce_messages(want))


BROKEN = [{"role": "user", "content": "look it up"},
          {"role": "assistant", "content": None,
           "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]


def test_bad_row_skip_and_raise():
    convs = _conversations(20)
    items = [{"id": i, "messages": c} for i, c in enumerate(convs)]
    items.insert(7, {"id": 999, "messages": BROKEN})
    rows = build_dataset(ray.data.from_items(items), SPEC, batch_size=8, on_error="skip", id_column="id").take_all()
    assert [r["id"] for r in rows] == [it["id"] for it in items]
    bad = [r for r in rows if r["error"] is not None]
    assert [r["id"] for r in bad] == [999] and "ToolCallHistoryError" in bad[0]["error"]
    assert bad[0]["messages"] is None
    with pytest.raises(Exception, match="id=999"):
        build_dataset(ray.data.from_items(items), SPEC, batch_size=8, id_column="id").take_all()


def test_worker_death_is_retried_without_loss_or_duplicates(tmp_path):
    convs = _conversations(60)
    marker = str(tmp_path / "died")

    class KillOnce:
        def __init__(self):
            from jianmu_fast.integrations.ray import BuildPrompts
            self.fn = BuildPrompts(SPEC)

        def __call__(self, batch):
            if not os.path.exists(marker):
                Path(marker).write_text(str(os.getpid()))
                os._exit(1)
            return self.fn(batch)

    ds = ray.data.from_items([{"id": i, "messages": c} for i, c in enumerate(convs)])
    rows = ds.map_batches(KillOnce, batch_size=10, compute=ray.data.ActorPoolStrategy(size=2),
                          batch_format="pyarrow", max_restarts=-1, max_task_retries=-1).take_all()
    assert os.path.exists(marker)  # a worker did die
    assert [r["id"] for r in rows] == list(range(len(convs)))
    want = BuildPrompts(SPEC).build_rows(convs)["messages"]
    assert [_normal(r["messages"]) for r in rows] == [_normal(w) for w in want]


def test_cli_engine_ray_equals_local(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    lines = EXAMPLES.read_text(encoding="utf-8").splitlines()[:80]
    lines.insert(10, "{not json")
    lines.insert(30, json.dumps({"messages": BROKEN}))
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    flags = ["--preset", "react", "--max-tokens", "4000", "--tools-desc-file", SPEC["tools_desc_file"],
             "--on-error", "skip"]
    assert main(["build", str(src), "-o", str(tmp_path / "local.jsonl"), *flags]) == 0
    err_local = capsys.readouterr().err
    assert main(["build", str(src), "-o", str(tmp_path / "ray.jsonl"), "--engine", "ray", *flags]) == 0
    err_ray = capsys.readouterr().err
    assert (tmp_path / "ray.jsonl").read_text() == (tmp_path / "local.jsonl").read_text()
    for text in (err_local, err_ray):
        assert f"{src}:11:" in text and f"{src}:31:" in text
    # --on-error raise: stops at the first bad line, exit 1, the lines before it written
    assert main(["build", str(src), "-o", str(tmp_path / "r1.jsonl"), *flags[:-2]]) == 1
    assert main(["build", str(src), "-o", str(tmp_path / "r2.jsonl"), "--engine", "ray", *flags[:-2]]) == 1
    assert (tmp_path / "r1.jsonl").read_text() == (tmp_path / "r2.jsonl").read_text()
    assert len((tmp_path / "r1.jsonl").read_text().splitlines()) == 10


def test_cli_engine_ray_reads_parquet_through_ray_data(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = [l for l in EXAMPLES.read_text(encoding="utf-8").splitlines() if l.strip()][:50]
    pq.write_table(pa.Table.from_pylist([json.loads(l) for l in lines]), tmp_path / "in.parquet")
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    flags = ["--preset", "react", "--max-tokens", "4000", "--tools-desc-file", SPEC["tools_desc_file"]]
    assert main(["build", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "a.jsonl"), *flags]) == 0
    assert main(["build", str(tmp_path / "in.parquet"), "-o", str(tmp_path / "b.jsonl"), "--engine", "ray",
                 "--workers", "2", *flags]) == 0
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    capsys.readouterr()
