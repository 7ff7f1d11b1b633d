"""Local ``build_batch`` against the Ray Data engine on one machine (issue 18).

Run inside a loopback-only namespace, as the tests do::

    unshare -n -p -f --mount-proc sh -c 'ip link set lo up && .venv/bin/python benchmarks/ray_vs_local.py'

It prints wall-clock seconds for N real-shaped conversations (examples/conversations.jsonl,
repeated with fresh ids) through ``build_batch`` in this process, and through
``build_dataset`` on a local Ray instance with 2 CPUs (Ray start-up timed apart).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = {"preset": "react", "max_tokens": 4000, "tokenizer": "o200k_base",
        "tools_desc_file": str(ROOT / "examples" / "tools_desc.txt")}


def conversations(n: int) -> list:
    base = [json.loads(l) for l in (ROOT / "examples" / "conversations.jsonl").read_text().splitlines() if l.strip()]
    out = []
    for i in range(n):
        obj = base[i % len(base)]
        msgs = obj["messages"] if isinstance(obj, dict) else obj
        # a distinct first user text per copy, so counting caches are not flattered
        out.append([dict(m, content=f"[{i}] {m['content']}") if m.get("role") == "user" and isinstance(m.get("content"), str) else m
                    for m in msgs])
    return out


def main() -> None:
    import ray
    import ray.data

    from jianmu_fast.integrations.ray import BuildPrompts, build_dataset

    sizes = [int(a) for a in sys.argv[1:]] or [2_000, 20_000, 100_000]
    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    print(f"ray start-up: {time.perf_counter() - t:.1f} s")
    for n in sizes:
        convs = conversations(n)
        t = time.perf_counter()
        BuildPrompts(SPEC).build_rows(convs)
        local = time.perf_counter() - t
        ds = ray.data.from_items([{"id": i, "messages": c} for i, c in enumerate(convs)])
        t = time.perf_counter()
        build_dataset(ds, SPEC, batch_size=1024, compute=ray.data.ActorPoolStrategy(size=2)).materialize()
        remote = time.perf_counter() - t
        print(f"{n:>8} conversations: local {local:6.2f} s, ray (2 actors) {remote:6.2f} s, ratio {remote / local:.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
