"""Packaging promises of issue 14: the lean core install, the metadata, and the Makefile's
two installs. The sdist and wheel themselves are built, installed and smoke-tested by
``.ci/dist-smoke`` (``make dist-check``), which needs the package index and so is not a unit test.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_JSON = ROOT / "tests" / "data" / "all-MiniLM-L6-v2.tokenizer.json"

# Runs in a fresh interpreter where importing `tokenizers` fails as if it were not installed.
WITHOUT_TOKENIZERS = r"""
import importlib.abc, json, sys

class NoTokenizers(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tokenizers" or name.startswith("tokenizers."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTokenizers())
from jianmu_fast.memory.context import ContextBuilder, HFTokenCounter, TiktokenTokenCounter
from jianmu_fast.message import human

out = {}
builder = ContextBuilder.for_chat(system_prompt="Be terse.", max_tokens=50,
                                  token_counter=TiktokenTokenCounter("o200k_base"))
out["core"] = [m.role for m in builder.build({"messages": [human("hi")]})]
try:
    HFTokenCounter(sys.argv[1])
except ImportError as exc:
    out["error"] = [type(exc).__name__, str(exc), type(exc.__cause__).__name__]
out["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] == "tokenizers")
print(json.dumps(out))
"""


def test_hf_counter_without_tokenizers_names_the_extra():
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TOKENIZERS, str(TOKENIZER_JSON)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["core"] == ["system", "user"]  # the core works without the extra
    name, text, cause = out["error"]
    assert name == "ImportError" and cause == "ModuleNotFoundError"
    assert "HFTokenCounter" in text and "pip install 'jianmu_fast[hf]'" in text, text
    assert out["loaded"] == []


def test_hf_counter_with_tokenizers_counts():
    pytest.importorskip("tokenizers", reason="the [hf] extra is not installed")
    from jianmu_fast.memory.context import HFTokenCounter

    assert HFTokenCounter(str(TOKENIZER_JSON)).count_text("hello world") == 2


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_core_install_requires_only_the_lean_dependencies():
    """What `pip install jianmu_fast` pulls in, as the installed metadata says: no tokenizer
    library beyond tiktoken and no framework; each extra lists its own packages."""
    requires = importlib.metadata.requires("jianmu_fast") or []
    core = sorted(_name(r) for r in requires if "extra ==" not in r)
    assert core == ["numpy", "pydantic", "pyyaml", "tiktoken"]
    hf = sorted(_name(r) for r in requires if re.search(r"""extra\s*==\s*["']hf["']""", r))
    assert hf == ["jinja2", "tokenizers"]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_metadata_license_and_classifiers():
    data = _pyproject()
    project = data["project"]
    assert project["license"] == "MIT"  # an SPDX expression, not the deprecated table
    assert project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert "Typing :: Typed" in project["classifiers"]
    assert (ROOT / "jianmu_fast" / "py.typed").exists()
    # setuptools understands license expressions and license-files from 77 on
    assert "setuptools>=77" in data["build-system"]["requires"]


def _makefile_tree(tmp_path: Path) -> Path:
    """A copy of the Makefile in ``tmp_path`` with the files its targets depend on (empty) and
    a venv with a python; the venv's path."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    for f in ("pyproject.toml", "setup.py"):
        (tmp_path / f).touch()
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "_filter_core.pyx").touch()
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    return venv


def _make_dry(tmp_path: Path, venv: Path, *args: str) -> str:
    """What ``make -n`` (prints, runs nothing) would run for ``args`` in that copy."""
    proc = subprocess.run(["make", "-n", f"VENV={venv}", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_installs_cli_and_make_test_adds_dev(tmp_path):
    """`make -n` (prints, runs nothing) in a copy of the Makefile: `make run` installs the
    [cli,report] extras, `make test` the [dev] extra into the same venv, both editable in compat mode;
    after `make test`, `make run` reuses that install."""
    venv = _makefile_tree(tmp_path)

    def dry(target: str) -> str:
        return _make_dry(tmp_path, venv, target)

    run, test = dry("run"), dry("test")
    assert "editable_mode=compat -e .\"[cli,report]\"" in run and "[dev]" not in run  # the run writes a report
    assert "editable_mode=compat -e .\"[dev]\"" in test and "[cli]" not in test
    # the suite on both backends, side by side: compiled with half the examples, pure with a quarter
    assert test.count("-m pytest -q") == 2 and "JIANMU_FAST_PURE_PYTHON=1" in test and "wait $pure" in test
    assert "JIANMU_FAST_EXAMPLES_SCALE=0.25" in test and "JIANMU_FAST_EXAMPLES_SCALE=0.5" in test
    (venv / ".jianmu_fast-installed").touch()  # as `make test` leaves it
    rerun = dry("run")
    assert "pip install" not in rerun and "jianmu-fast build" in rerun
    # the pure-Python twin that csrc/_template_core.pyx includes: editing it rebuilds the core
    twin = tmp_path / "jianmu_fast" / "_template_core_py.py"
    twin.parent.mkdir()
    twin.touch()
    stamp = (venv / ".jianmu_fast-installed").stat().st_mtime
    os.utime(twin, (stamp + 10, stamp + 10))
    assert "editable_mode=compat -e .\"[dev]\"" in dry("test")


@pytest.mark.parametrize("mode,profile,says", [
    ("fast", None, "JIANMU_FAST_PGO: expected 'generate' or 'use', got 'fast'"),
    ("use", "no-such-profile", "JIANMU_FAST_PGO=use: no profile at "),
])
def test_a_bad_pgo_setting_stops_the_build_naming_it(tmp_path, mode, profile, says):
    """setup.py reads ``JIANMU_FAST_PGO`` (``make pgo``) before anything else: a value it does
    not know, or ``use`` without a profile, stops the build with a message naming it (not a
    plain build that silently ignores it, nor a compiler error about a missing file)."""
    env = {**os.environ, "JIANMU_FAST_PGO": mode}
    if profile is not None:
        env["JIANMU_FAST_PGO_DIR"] = str(tmp_path / profile)
    proc = subprocess.run([sys.executable, str(ROOT / "setup.py"), "--name"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert says in proc.stderr
    if profile is not None:
        assert str(tmp_path / profile) in proc.stderr and "make pgo" in proc.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_pgo_trains_between_an_instrumented_and_a_profiled_build(tmp_path):
    """`make -n pgo`: Cython and setuptools installed into the venv, then the cores built in
    place instrumented, the training run, and the cores built in place again from the same
    profile folder -- in that order -- and the backend checked; `make -n dist PGO=1` builds
    the wheel from that profile."""
    venv = _makefile_tree(tmp_path)
    (venv / ".jianmu_fast-installed").touch()  # as `make test` leaves it
    lines = _make_dry(tmp_path, venv, "pgo").splitlines()
    steps = [next(i for i, line in enumerate(lines) if want in line) for want in (
        "Cython>=3.0", "JIANMU_FAST_PGO=generate", "benchmarks/pgo_train.py", "JIANMU_FAST_PGO=use",
        "BACKEND == 'cython'")]
    assert steps == sorted(steps)
    build = [line for line in lines if "setup.py" in line]
    assert len(build) == 2 and all("build_ext --inplace --force" in b and "JIANMU_FAST_PGO_DIR=build/pgo" in b
                                   for b in build)
    # `make dist PGO=1`: the wheel compiled from that profile (its absolute path: the wheel
    # is built from the sdist elsewhere); a plain `make dist` passes no PGO setting
    dist = _make_dry(tmp_path, venv, "dist", "PGO=1")
    assert f"JIANMU_FAST_PGO=use JIANMU_FAST_PGO_DIR={tmp_path}/build/pgo build/dist-tools/bin/python -m build" in dist
    plain = _make_dry(tmp_path, venv, "dist")
    assert "-m build" in plain and "JIANMU_FAST_PGO" not in plain
