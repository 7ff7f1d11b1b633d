"""``HFTokenCounter`` from a model directory and from a model id in the local HuggingFace cache,
offline, without importing ``huggingface_hub``; clear errors saying where it looked."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jianmu_fast.errors import TokenizerLoadError
from jianmu_fast.memory.context import HFTokenCounter

DATA = Path(__file__).resolve().parent / "data"
TOKENIZER = DATA / "all-MiniLM-L6-v2.tokenizer.json"
COMMIT = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"


@pytest.fixture
def hf_env(monkeypatch, tmp_path):
    """No HuggingFace cache variables from the machine; HOME in tmp_path."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def make_cache(hub: Path, repo_id: str, commit: str = COMMIT, ref: str | None = "main", source: Path = TOKENIZER) -> Path:
    """The layout huggingface_hub writes: blobs by sha256, snapshots of symlinks, refs/<ref>."""
    folder = hub / ("models--" + repo_id.replace("/", "--"))
    data = source.read_bytes()
    blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "tokenizer.json").symlink_to(os.path.relpath(blob, snap))
    (snap / "config.json").write_text("{}")
    if ref is not None:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return snap / "tokenizer.json"


def counts(c):
    return c.count_text("hello world"), c.count_text("The quick brown fox jumps over the lazy dog.")


EXPECTED = counts(HFTokenCounter(TOKENIZER))


def test_model_directory(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(TOKENIZER, d / "tokenizer.json")
    (d / "config.json").write_text("{}")
    c = HFTokenCounter(d)
    assert counts(c) == EXPECTED and c.path == str(d / "tokenizer.json")
    assert counts(HFTokenCounter(str(d))) == EXPECTED
    assert counts(pickle.loads(pickle.dumps(c))) == EXPECTED


def test_model_directory_without_tokenizer_json(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "tokenizer.model").write_bytes(b"sp")
    with pytest.raises(TokenizerLoadError, match=r"the directory .*model' has no tokenizer.json \(it holds tokenizer.model\)"):
        HFTokenCounter(d)


@pytest.mark.parametrize("var, sub", [("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""), ("HF_HOME", "hub"),
                                      ("XDG_CACHE_HOME", "huggingface/hub"), (None, ".cache/huggingface/hub")])
def test_model_id_in_the_cache(hf_env, tmp_path, var, sub):
    root = tmp_path / "home" if var is None else tmp_path / "cache"
    if var is not None:
        hf_env.setenv(var, str(root))
    expected = make_cache(root / sub, "sentence-transformers/all-MiniLM-L6-v2")
    c = HFTokenCounter("sentence-transformers/all-MiniLM-L6-v2")
    assert counts(c) == EXPECTED and c.path == str(expected)
    assert counts(pickle.loads(pickle.dumps(c))) == EXPECTED


def test_revision_and_refs(hf_env, tmp_path):
    hub = tmp_path / "hub"
    hf_env.setenv("HF_HUB_CACHE", str(hub))
    make_cache(hub, "org/m", commit="a" * 40, ref="main")
    other = tmp_path / "other.json"
    tok = json.loads(TOKENIZER.read_text())
    tok["normalizer"] = None  # no lower-casing: counts differ from the main snapshot's on capitals
    other.write_text(json.dumps(tok))
    make_cache(hub, "org/m", commit="b" * 40, ref="v2", source=other)
    main, v2, by_commit = HFTokenCounter("org/m"), HFTokenCounter("org/m", revision="v2"), HFTokenCounter("org/m", revision="b" * 40)
    assert main.path.endswith("a" * 40 + "/tokenizer.json") and v2.path == by_commit.path
    assert v2.path.endswith("b" * 40 + "/tokenizer.json")
    assert main.count_text("HELLO Tokenizers") != v2.count_text("HELLO Tokenizers")
    with pytest.raises(TokenizerLoadError, match=r"has no revision 'v3' and 2 snapshot\(s\) with a tokenizer.json"):
        HFTokenCounter("org/m", revision="v3")


def test_single_snapshot_without_refs(hf_env, tmp_path):
    hf_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    expected = make_cache(tmp_path / "hub", "solo", ref=None)  # a model id without an org
    assert HFTokenCounter("solo").path == str(expected)
    make_cache(tmp_path / "hub", "solo", commit="d" * 40, ref=None)
    with pytest.raises(TokenizerLoadError, match=r"has no refs/main and 2 snapshot\(s\) .*pass revision="):
        HFTokenCounter("solo")


def test_model_id_not_in_the_cache_names_where_it_looked(hf_env, tmp_path):
    hf_env.setenv("HF_HOME", str(tmp_path / "hfhome"))
    with pytest.raises(TokenizerLoadError) as ei:
        HFTokenCounter("org/missing-model")
    msg = str(ei.value)
    assert "'org/missing-model': it is not a file or a directory" in msg
    assert f"cache {str(tmp_path / 'hfhome' / 'hub')!r} (from $HF_HOME/hub) has no 'models--org--missing-model'" in msg
    assert "huggingface-cli download org/missing-model tokenizer.json" in msg


def test_cached_snapshot_without_tokenizer_json(hf_env, tmp_path):
    hub = tmp_path / "hub"
    hf_env.setenv("HF_HUB_CACHE", str(hub))
    make_cache(hub, "org/sp")
    (hub / "models--org--sp" / "snapshots" / COMMIT / "tokenizer.json").unlink()
    with pytest.raises(TokenizerLoadError, match=r"the cached snapshot has no tokenizer.json \(looked for .*"
                                                 + COMMIT + r"/tokenizer.json"):
        HFTokenCounter("org/sp")


def test_missing_json_path_is_still_a_file_error(hf_env, tmp_path):
    with pytest.raises(TokenizerLoadError, match="reading .*nope.json' failed"):
        HFTokenCounter(str(tmp_path / "nope.json"))


def test_huggingface_hub_is_not_imported(tmp_path):
    hub = tmp_path / "hub"
    make_cache(hub, "org/m")
    code = ("import sys, json; from jianmu_fast.memory.context import HFTokenCounter; "
            "c = HFTokenCounter('org/m'); print(json.dumps([c.count_text('hello world'), "
            "[m for m in ('huggingface_hub', 'transformers') if m in sys.modules]]))")
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert json.loads(out.stdout) == [EXPECTED[0], []]
