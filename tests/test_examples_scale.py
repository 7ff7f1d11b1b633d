"""``JIANMU_FAST_EXAMPLES_SCALE`` reaches every hypothesis test (``tests/conftest.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROBE = textwrap.dedent("""
    from hypothesis import given, settings, strategies as st

    class TestInAClass:
        @settings(max_examples=40, database=None)
        @given(st.integers())
        def test_method(self, x):
            print("run method")

    @settings(max_examples=40, database=None)
    @given(st.integers())
    @pytest.mark.parametrize("p", [1, 2])
    def test_function(p, x):
        print("run function", p)
""")


def _pytest(tmp_path: Path, scale: str) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "examples_scale.py"):
        (tmp_path / name).write_text((Path(__file__).parent / name).read_text(encoding="utf-8"))
    (tmp_path / "test_probe.py").write_text("import pytest\n" + PROBE)
    env = {**os.environ, "JIANMU_FAST_EXAMPLES_SCALE": scale}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


@pytest.mark.parametrize("scale, runs", [("1", 40), ("0.25", 10), ("0.001", 1)])
def test_every_hypothesis_test_runs_its_scaled_examples(tmp_path, scale, runs):
    """Functions, parametrized functions (one settings object for all their cases) and
    methods each run ``max_examples x scale`` examples (integers never run out of values)."""
    r = _pytest(tmp_path, scale)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [r.stdout.count(f"run {what}\n") for what in ("method", "function 1", "function 2")] == [runs] * 3


def test_a_scale_out_of_range_is_a_clear_error(tmp_path):
    r = _pytest(tmp_path, "2")
    assert r.returncode != 0
    assert "JIANMU_FAST_EXAMPLES_SCALE must be in (0, 1], got 2.0" in r.stdout + r.stderr
