"""The backend is named, and a missing compiled core is never a silent fallback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import jianmu_fast

PKG = Path(jianmu_fast.__file__).parent


# An editable install maps jianmu_fast._filter_core straight to the source tree's .so;
# drop that finder so the copy is what gets imported.
_NO_EDITABLE = (
    "import sys; sys.meta_path[:] = [f for f in sys.meta_path "
    "if 'editable' not in getattr(f, '__module__', '') and 'editable' not in getattr(f, '__name__', '')]; "
)


def _run(code: str, env_extra: dict, cwd: Path) -> subprocess.CompletedProcess:
    code = _NO_EDITABLE + code
    env = {k: v for k, v in os.environ.items() if k != "JIANMU_FAST_PURE_PYTHON"}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


@pytest.fixture
def copy_without_core(tmp_path):
    """The package copied without its compiled extension, as after a failed build."""
    shutil.copytree(PKG, tmp_path / "jianmu_fast", ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    return tmp_path


def test_missing_extension_is_an_import_error_that_says_how_to_fix_it(copy_without_core):
    proc = _run("import jianmu_fast", {"PYTHONPATH": str(copy_without_core)}, copy_without_core)
    assert proc.returncode != 0
    assert "ImportError: jianmu_fast._filter_core is not compiled: run `pip install -e .`" in proc.stderr
    assert "JIANMU_FAST_PURE_PYTHON=1" in proc.stderr


def test_pure_python_is_chosen_only_on_request(copy_without_core):
    proc = _run("import jianmu_fast; print(jianmu_fast.BACKEND)",
                {"PYTHONPATH": str(copy_without_core), "JIANMU_FAST_PURE_PYTHON": "1"}, copy_without_core)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "python"


def test_backend_matches_the_environment():
    expected = "python" if os.environ.get("JIANMU_FAST_PURE_PYTHON") == "1" else "cython"
    assert jianmu_fast.BACKEND == expected
    module = jianmu_fast._backend.select_window.__module__
    assert module == ("jianmu_fast._filter_core_py" if expected == "python" else "jianmu_fast._filter_core")


@pytest.mark.skipif(os.environ.get("JIANMU_FAST_PURE_PYTHON") == "1", reason="checks the compiled core")
@pytest.mark.parametrize("module", ["_filter_core", "_template_core"])
def test_compiled_stub_is_honest(tmp_path, module):
    """mypy's stubtest checks jianmu_fast/<module>.pyi against the compiled module.

    Type errors elsewhere in the package are not this test's business, so the config only
    reports on the compiled module's stub."""
    pytest.importorskip("mypy")
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n\n[mypy-jianmu_fast.*]\nignore_errors = True\n\n"
                      f"[mypy-jianmu_fast.{module}]\nignore_errors = False\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", f"jianmu_fast.{module}", "--mypy-config-file", str(config)],
        capture_output=True, text=True, timeout=300, cwd=PKG.parent,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
