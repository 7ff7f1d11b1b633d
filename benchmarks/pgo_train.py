"""The training run of a profile-guided build (``make pgo``): what the compiled cores run most,
run once on an instrumented build (``JIANMU_FAST_PGO=generate``, see ``setup.py``), so that
the final build (``JIANMU_FAST_PGO=use``) lays their code out by it.

It runs the workloads the benchmarks time, on bundled data only (no network):

- the README's main job: ``jianmu-fast build`` on ``examples/conversations.jsonl`` with the
  ``react`` preset (the filter and batch cores, tiktoken);
- ``ChatTemplateTokenCounter`` and ``HFTokenCounter`` on every bundled template family
  (``tests/data/chat_templates``): the eval regime (customer-service conversations through
  one counter, with and without reasoning, a budget filter each), the coding regime, and the
  seeded hot loop with the request's tools -- fastokens where installed, else tokenizers.

Usage: ``python benchmarks/pgo_train.py [--conversations N]`` (default 120 a family; about a
minute on 2 cores with fastokens). It checks nothing: a build's correctness is the test suite's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def main_job(out: str) -> None:
    """The README's main job (``make run``), through the installed CLI's module."""
    subprocess.run([sys.executable, "-c", "import sys; from jianmu_fast.cli import main; sys.exit(main())", "build",
                    os.path.join(ROOT, "examples", "conversations.jsonl"), "-o", os.path.join(out, "prompts.jsonl"),
                    "--preset", "react", "--tools-desc-file", os.path.join(ROOT, "examples", "tools_desc.txt"),
                    "--max-tokens", "4000"], check=True, stdout=subprocess.DEVNULL)


def templates(out: str, conversations: int) -> None:
    """The chat-template counters' regimes on every bundled family."""
    sys.path.insert(0, HERE)
    tct = _load("tct", os.path.join(HERE, "test_chat_template.py"))
    from jianmu_fast.memory.context import ChatTemplateTokenCounter, HFTokenCounter

    engine = "fastokens" if "fastokens" in tct.ENGINES else "tokenizers"
    for fam in tct.FAMILIES:
        d = tct.mk.model_dir(fam, os.path.join(out, fam))
        counters = [ChatTemplateTokenCounter(d, engine=engine), HFTokenCounter(os.path.join(d, "tokenizer.json"), engine=engine)]
        for trace, n in (("cs", conversations), ("cs-reasoning", conversations // 2), ("coding", max(2, conversations // 20))):
            before, turns = tct._split(24 if trace != "coding" else 150, fam, trace)
            convs = [([tct._variant(m, k) for m in before], [[tct._variant(m, k) for m in u] for u in turns]) for k in range(n)]
            for counter in counters:
                tct._eval_round(counter, trace, fam, convs)
        # the seeded hot loop, its requests with tools: test_ratios' round (one filter, one conversation)
        for impl in ("chat_template", "hf"):
            setup, target = tct._round(impl, 40, d, fam, engine, True, "seeded")
            target(*setup()[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=120, help="eval-regime conversations a family (default 120)")
    args = p.parse_args()
    import jianmu_fast

    if jianmu_fast.BACKEND != "cython":
        raise SystemExit(f"pgo_train: the compiled cores are not in use (backend {jianmu_fast.BACKEND!r})")
    with tempfile.TemporaryDirectory() as out:
        main_job(out)
        templates(out, args.conversations)
    print(f"pgo_train: done ({args.conversations} conversations a family)")


if __name__ == "__main__":
    main()
