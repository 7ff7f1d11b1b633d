"""A cluster started with `ray start --head` and reached by its address (runs after the
local instance of test_local.py has shut down), with token authentication on
(``RAY_AUTH_MODE=token``): the command line supplies the token as ``RAY_AUTH_TOKEN``, as the
README tells users to."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
PORT = "6399"
TOKEN = secrets.token_hex(16)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)
    start = subprocess.run(
        [RAY, "start", "--head", "--port", PORT, "--num-cpus", "2", "--include-dashboard", "false",
         "--node-ip-address", "127.0.0.1", "--temp-dir", str(tmp)],
        env=env, capture_output=True, text=True, timeout=180,
    )
    assert start.returncode == 0, start.stdout + start.stderr
    yield f"127.0.0.1:{PORT}", env
    # inside this test's own PID namespace: `ray stop` can only reach the processes started here
    subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_cli_reaches_cluster_by_address(cluster, tmp_path):
    address, env = cluster
    src = ROOT / "examples" / "conversations.jsonl"
    flags = ["--preset", "react", "--max-tokens", "4000", "--tools-desc-file", str(ROOT / "examples" / "tools_desc.txt")]
    cli = [sys.executable, "-m", "jianmu_fast"]
    local = subprocess.run([*cli, "build", str(src), *flags], capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    remote = subprocess.run([*cli, "build", str(src), *flags, "--engine", "ray", "--ray-address", address],
                            capture_output=True, text=True, timeout=600, env=env)
    assert remote.returncode == 0, remote.stderr[-3000:]
    assert remote.stdout == local.stdout
    assert len(remote.stdout.splitlines()) == len([l for l in src.read_text().splitlines() if l.strip()])


def test_a_client_without_the_token_is_refused(cluster):
    address, env = cluster
    src = ROOT / "examples" / "conversations.jsonl"
    bad = dict(env, RAY_AUTH_TOKEN="0" * 32)
    proc = subprocess.run([sys.executable, "-m", "jianmu_fast", "build", str(src), "--engine", "ray",
                           "--ray-address", address], capture_output=True, text=True, timeout=300, env=bad)
    assert proc.returncode == 2 and not proc.stdout
    assert f"cannot reach the cluster at {address}" in proc.stderr and "RAY_AUTH_TOKEN" in proc.stderr
