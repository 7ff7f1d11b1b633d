"""Instructions per steady hot-loop turn under callgrind (issue 17's counter against
``HFTokenCounter``): deterministic where time on a shared machine is not.

Run from the repository root (valgrind installed, the package built; ~2-3 minutes a family)::

    .venv/bin/python benchmarks/callgrind_turns.py --trace cs --size 24 --families qwen3,deepseek-v3
    .venv/bin/python benchmarks/callgrind_turns.py --trace seeded --size 40 --tools --families gpt-oss
    .venv/bin/python benchmarks/callgrind_turns.py --trace cs --size 24 --conversations 60 --families qwen3

``--conversations N`` measures the eval regime instead (``test_eval_regime_ratios``): N variants
of the conversation through one counter, each with a fresh budget filter, its first call and its
turns; the first half warms the counter, the second half is one region (session 32: Qwen3 cs 24,
199k instructions a turn against ``HFTokenCounter``'s 112k, 1.77x; 2.0-2.4x in time: the turn
is bound by cache misses in the counter's large caches more than the hot loop's is).

For each family and counter (``--impls``, default ``chat_template,hf``) it replays the turns of
``benchmarks/test_chat_template.py`` (``_round``: append a unit, trim to the budget, count the
prompt sent, fastokens engine) ``--replays`` times in one process (default 3): the first rounds
warm the code and the template's shared frame and plan tables, then a fresh counter and filter
replay the turns again, the first half unmeasured and the second half measured, so the figure
is a warm turn's (the first turns after a fresh counter do the counter's remaining set-up). Two
replays are not always warm: on the coding trace a second fresh counter still learned frames
and built unit plans that the first had not reached (DeepSeek-V3: 3.42x ``HFTokenCounter`` in
the second replay, 1.74x in the third). Each measured region runs inside libc's ``qsort`` (a 2-element
sort whose comparator runs the region once) under ``valgrind --tool=callgrind
--collect-atstart=no --toggle-collect=qsort_r --dump-after=qsort_r``: one dump per region,
whose ``summary:`` line is the region's instructions. Build the compiled module with
``-g -fno-optimize-sibling-calls`` (unstripped) to read a dump per function with
``callgrind_annotate --inclusive=yes OUT/cg.N``; call counts there are not reliable for the
first region after a set-up, inclusive costs are.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def _measure(fn) -> None:
    """Run ``fn`` once inside libc's qsort (the region callgrind toggles on)."""
    libc = ctypes.CDLL(None)
    cmp_t = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    done: list = []

    def cmp(a, b):
        if not done:
            fn()
            done.append(1)
        return 0

    arr = (ctypes.c_int * 2)(1, 2)
    c = cmp_t(cmp)
    libc.qsort(arr, 2, ctypes.sizeof(ctypes.c_int), c)


def _turn(counter, flt, history: list, unit: list, schemas) -> None:
    """A turn: ``unit`` appended, the history trimmed, the request counted (tools included)."""
    history.extend(unit)
    kept = flt.apply(history, tools_schema=schemas)
    counter.count_messages(kept) + flt.tools_cost(schemas, kept)


def _eval_regions(tct, args: argparse.Namespace, fam: str, d: str, schemas) -> list:
    """``--conversations N``: the eval regime (``test_eval_regime_ratios``): N variants of the
    trace's conversation through one counter per impl, each with a fresh budget filter, its
    first call and its turns; the first half unmeasured (the counter's set-up, the template's
    frames and plans), the second half one region. Labels count the measured turns."""
    import gc

    from jianmu_fast.memory.context import ChatTemplateTokenCounter, HFTokenCounter, TokenBudgetFilter

    before, turns = tct._split(args.size, fam, args.trace)
    convs = [([tct._variant(m, k) for m in before], [[tct._variant(m, k) for m in u] for u in turns])
             for k in range(args.conversations)]
    half = len(convs) // 2
    labels = []
    for impl in args.impls.split(","):
        counter = (ChatTemplateTokenCounter(d, engine="fastokens") if impl == "chat_template"
                   else HFTokenCounter(os.path.join(d, "tokenizer.json"), engine="fastokens"))

        def replay(part):
            def run():
                for start, units in part:
                    flt = TokenBudgetFilter(tct.BUDGETS[args.trace], counter=counter)
                    history = list(start)
                    _turn(counter, flt, history, [], schemas)  # (the conversation's first call)
                    for unit in units:
                        _turn(counter, flt, history, unit, schemas)
            return run

        replay(convs[:half])()
        gc.collect()
        _measure(replay(convs[half:]))
        labels.append([fam, impl, sum(len(u) for _, u in convs[half:])])
    return labels


def inner(args: argparse.Namespace) -> None:
    """The measured process (under valgrind): one region per family and counter."""
    sys.path.insert(0, HERE)
    spec = importlib.util.spec_from_file_location("tct", os.path.join(HERE, "test_chat_template.py"))
    tct = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tct)  # type: ignore[union-attr]
    schemas = tct._tools_of(args.trace) if args.tools else None
    labels = []
    for fam in args.families.split(","):
        d = os.path.join(args.out, "models", fam)
        if not os.path.exists(os.path.join(d, "tokenizer.json")):
            os.makedirs(d, exist_ok=True)
            tct.mk.model_dir(fam, d)
        if args.conversations:
            labels += _eval_regions(tct, args, fam, d, schemas)
            continue
        _, turns = tct._split(args.size, fam, args.trace)
        half = len(turns) // 2
        for impl in args.impls.split(","):
            for rep in range(args.replays):
                setup, _ = tct._round(impl, args.size, d, fam, "fastokens", args.tools, args.trace)
                (counter, flt, history), _ = setup()

                def replay(units):
                    def run():
                        for unit in units:
                            _turn(counter, flt, history, unit, schemas)
                    return run

                replay(turns[:half])()
                if rep == args.replays - 1:
                    _measure(replay(turns[half:]))
                    labels.append([fam, impl, len(turns) - half])
                else:
                    replay(turns[half:])()
    with open(os.path.join(args.out, "labels.json"), "w") as f:
        json.dump(labels, f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default="cs", choices=["seeded", "cs", "coding", "cs-reasoning", "coding-reasoning"])
    p.add_argument("--size", type=int, default=24)
    p.add_argument("--tools", action="store_true", help="the requests carry the trace's tools")
    p.add_argument("--families", default="qwen3,deepseek-v3")
    p.add_argument("--impls", default="chat_template,hf")
    p.add_argument("--replays", type=int, default=3,
                   help="rounds per counter, the last one measured (at least 2; default 3)")
    p.add_argument("--out", default=None, help="where the dumps go (default: a new temporary folder)")
    p.add_argument("--conversations", type=int, default=0,
                   help="the eval regime instead: this many variants of the conversation through one counter "
                        "(first calls included; the second half measured)")
    p.add_argument("--cache-sim", action="store_true",
                   help="also simulate the caches (32 KiB L1s, --l2-bytes as the last level) and print each "
                        "counter's L1 and last-level misses per turn")
    p.add_argument("--l2-bytes", type=int, default=512 * 1024,
                   help="the simulated last-level cache with --cache-sim (default 512 KiB: a core's L2 on the "
                        "2-core AMD EPYC machines of session 36; valgrind's default is the machine's L3)")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.replays < 2:
        p.error(f"--replays must be at least 2 (a round warms, the last is measured), got {args.replays}")
    if args.inner:
        inner(args)
        return
    args.out = args.out or tempfile.mkdtemp(prefix="callgrind_turns.")
    os.makedirs(args.out, exist_ok=True)
    cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=qsort_r",
           "--dump-after=qsort_r", f"--callgrind-out-file={os.path.join(args.out, 'cg')}"] + (
        ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", f"--LL={args.l2_bytes},8,64"] if args.cache_sim else []) + [
           sys.executable, os.path.abspath(__file__), "--inner", "--trace", args.trace, "--size", str(args.size),
           "--families", args.families, "--impls", args.impls, "--out", args.out, "--replays", str(args.replays),
           "--conversations", str(args.conversations)] + (["--tools"] if args.tools else [])
    with open(os.path.join(args.out, "log"), "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    with open(os.path.join(args.out, "labels.json")) as f:
        labels = json.load(f)
    dumps = sorted(glob.glob(os.path.join(args.out, "cg.*")), key=lambda q: int(q.rsplit(".", 1)[1]))
    totals = []
    events: list = []  # (with --cache-sim: each dump's events by name)
    for q in dumps:
        with open(q) as f:
            text = f.read()
        summary = [int(x) for x in re.search(r"^summary: ([\d ]+)$", text, re.M).group(1).split()]  # type: ignore[union-attr]
        names = re.search(r"^events: (.+)$", text, re.M).group(1).split()  # type: ignore[union-attr]
        totals.append(summary[0])
        events.append(dict(zip(names, summary)))
    # the last dump is the process's exit; the regions are the len(labels) before it (earlier
    # dumps: qsort calls made while importing)
    regions = totals[-(len(labels) + 1):-1]
    per_turn = {(fam, impl): total / turns for (fam, impl, turns), total in zip(labels, regions)}
    misses = {(fam, impl): {k: v / turns for k, v in ev.items()}
              for (fam, impl, turns), ev in zip(labels, events[-(len(labels) + 1):-1])}
    regime = f", {args.conversations // 2} of {args.conversations} conversations measured" if args.conversations else ""
    print(f"{args.trace} {args.size}{' with tools' if args.tools else ''}{regime}: k instructions per warm turn (dumps in {args.out})")
    for (fam, impl), v in per_turn.items():
        base = per_turn.get((fam, "hf"))
        ratio = f"  {v / base:.2f}x hf" if base and impl != "hf" else ""
        print(f"  {fam:14s} {impl:14s} {v / 1000:8.1f}{ratio}")
        if args.cache_sim:
            m = misses[(fam, impl)]
            print(f"  {'':14s} {'':14s} misses per turn: L1 instr {m.get('I1mr', 0):.0f}, L1 data {m.get('D1mr', 0) + m.get('D1mw', 0):.0f}; "
                  f"last level ({args.l2_bytes // 1024} KiB) instr {m.get('ILmr', 0):.0f}, data read {m.get('DLmr', 0):.0f}, "
                  f"data write {m.get('DLmw', 0):.0f}")


if __name__ == "__main__":
    main()
