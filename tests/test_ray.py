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
    script = 'ip link set lo up && exec "$0" -m pytest -q -x -p no:cacheprovider -o addopts="" tests/ray_cases'
    proc = subprocess.run(
        ["unshare", "-n", "-p", "-f", "--mount-proc", "sh", "-c", script, sys.executable],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    shutil.rmtree(short, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
