"""Offline loading, integrity checks and lazy imports (subprocesses where the process matters)."""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jianmu_fast.errors import TokenizerLoadError
from jianmu_fast.memory.context._encodings import DATA_DIR, load_tiktoken_encoding

MINILM = Path(__file__).parent / "data" / "all-MiniLM-L6-v2.tokenizer.json"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(code: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "all_proxy")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


OFFLINE = r"""
import sys
from jianmu_fast.errors import TokenizerLoadError
from jianmu_fast.memory.context import HFTokenCounter, TiktokenTokenCounter
from jianmu_fast.message import human
for name, want in (("o200k_base", 9), ("cl100k_base", 9)):
    c = TiktokenTokenCounter(name)
    got = c.count_messages([human("hello world")])
    assert got == want, (name, got)
print("hf", HFTokenCounter(sys.argv[1] if len(sys.argv) > 1 else %r).count_text("hello world"))
try:
    TiktokenTokenCounter("r50k_base")
except TokenizerLoadError as exc:
    print("r50k:", exc)
else:
    print("r50k: loaded?!")
"""


def test_both_encodings_load_and_count_with_network_blocked(tmp_path):
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    proxy = f"http://127.0.0.1:{_closed_port()}"
    env = {"HTTPS_PROXY": proxy, "HTTP_PROXY": proxy, "https_proxy": proxy, "http_proxy": proxy,
           "TIKTOKEN_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    res = _run(OFFLINE % str(MINILM), env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "hf 2"
    # an encoding that does not ship needs tiktoken's download: the error says where it
    # looked and how to fix it
    assert lines[1].startswith("r50k: cannot load tiktoken encoding 'r50k_base'"), lines[1]
    assert str(cache) in lines[1] and "$TIKTOKEN_CACHE_DIR" in lines[1] and "o200k_base" in lines[1]
    assert list(cache.iterdir()) == [], "something was downloaded or cached"


def test_importing_the_package_loads_no_tokenizer():
    code = ("import sys, jianmu_fast, jianmu_fast.memory.context, jianmu_fast.memory.context.counters\n"
            "print(sorted(m for m in ('tiktoken', 'tiktoken_ext', 'tokenizers') if m in sys.modules))")
    res = _run(code, {})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def _copy_data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    for f in DATA_DIR.glob("*.tiktoken.gz"):
        shutil.copyfile(f, d / f.name)
    return d


def test_corrupted_shipped_file_raises(tmp_path):
    d = _copy_data(tmp_path)
    raw = gzip.decompress((d / "cl100k_base.tiktoken.gz").read_bytes())
    lines = raw.splitlines(keepends=True)
    lines[500], lines[501] = lines[501], lines[500]  # two ranks swapped: still parses
    (d / "cl100k_base.tiktoken.gz").write_bytes(gzip.compress(b"".join(lines)))
    with pytest.raises(TokenizerLoadError) as info:
        load_tiktoken_encoding("cl100k_base", data_dir=d)
    msg = str(info.value)
    assert "'cl100k_base'" in msg and str(d / "cl100k_base.tiktoken.gz") in msg
    assert "corrupted" in msg and "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7" in msg
    assert "reinstall" in msg.lower()
    assert isinstance(info.value, OSError)
    # the intact one in the same folder still loads
    assert load_tiktoken_encoding("o200k_base", data_dir=d).encode_ordinary("hello world") == [24912, 2375]


def test_missing_or_garbled_shipped_file_raises(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    with pytest.raises(TokenizerLoadError, match=r"'o200k_base'.*empty/o200k_base\.tiktoken\.gz.*Reinstall"):
        load_tiktoken_encoding("o200k_base", data_dir=d)
    (d / "o200k_base.tiktoken.gz").write_bytes(b"not gzip at all")
    with pytest.raises(TokenizerLoadError, match=r"'o200k_base'.*failed"):
        load_tiktoken_encoding("o200k_base", data_dir=d)


def _fill_tiktoken_cache(cache: Path, name: str) -> None:
    """Put the shipped file where tiktoken's own loader looks for it (sha1 of its URL)."""
    import hashlib

    url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
    cache.mkdir(exist_ok=True)
    data = gzip.decompress((DATA_DIR / f"{name}.tiktoken.gz").read_bytes())
    (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(data)


def test_shipped_encodings_equal_tiktokens_own(tmp_path, monkeypatch):
    """tiktoken's own get_encoding, fed the same file through its cache, tokenizes alike."""
    import tiktoken

    from test_counters_exact import TEXTS

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("o200k_base", "cl100k_base"):
        _fill_tiktoken_cache(tmp_path / "cache", name)
        ours, theirs = load_tiktoken_encoding(name), tiktoken.get_encoding(name)
        assert ours is not theirs
        assert ours._pat_str == theirs._pat_str and ours._special_tokens == theirs._special_tokens
        assert [ours.encode_ordinary(t) for t in TEXTS[:300]] == [theirs.encode_ordinary(t) for t in TEXTS[:300]]


def test_a_changed_pin_falls_back_to_tiktoken(tmp_path, monkeypatch):
    """When tiktoken pins another file than the one shipped, tiktoken's loading is used."""
    from jianmu_fast.memory.context import _encodings

    monkeypatch.setitem(_encodings.SHIPPED_ENCODINGS, "cl100k_base", "0" * 64)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    _fill_tiktoken_cache(tmp_path / "cache", "cl100k_base")
    enc = load_tiktoken_encoding("cl100k_base", data_dir=tmp_path / "unused")
    assert enc.encode_ordinary("hello world") == [15339, 1917]
