"""store_singles: store_bench's single-event appends, many times over, in several trees at once.

One `store_bench.py` run gives one ratio of trm to its raw reference for single-event appends,
and on a shared 2-CPU host that ratio moves by 0.02-0.05x from run to run: as much as the
differences between commits that issue 16's "keep their current ratios" asks about. This runs
only that section (`store_bench.bench_appends`, with the tree's own `learn` and `Shape`, so the
reference sends that tree's SQL), `--runs` times per tree, the trees taking turns run by run (a
drift of the host reaches each alike), each run in a fresh process and fresh files, and prints
each tree's mean, median and standard deviation of the ratio, wall and CPU, and its appends'
latency.

    .venv/bin/python bench/store_singles.py --durability full --runs 20
    git worktree add /tmp/before 62dc863
    .venv/bin/python bench/store_singles.py --tree before=/tmp/before --tree main=.

A tree is a checkout of this repository (any commit whose store_bench has `bench_appends`, `sizes`,
`learn` and `Shape`), imported from its own directory. Exit code 0 whatever the figures: it is a
report, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
DURABILITIES = ("full", "normal")

_CHILD = """
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, "bench")
import store_bench
from store_reference import register_workload
register_workload()
durability = sys.argv[1]
size = store_bench.sizes(quick=False, events=0)  # the tree's own: as its full run times them
per_round, rounds = size.fsyncs if durability == "full" else (size.singles, size.rounds)
with tempfile.TemporaryDirectory(prefix="store_singles-") as tmp:
    plan = store_bench.learn(Path(tmp))
    r = store_bench.bench_appends(
        Path(tmp), durability, store_bench.Shape(1, 1), (per_round, rounds), plan
    )
print(json.dumps([r.trm, r.raw, r.trm_cpu, r.raw_cpu]))
"""
"""One run, in the tree's directory with the tree first on the path: its bench and its store."""


def named_tree(value: str) -> tuple[str, Path]:
    """`NAME=PATH`, PATH a checkout with a bench directory."""
    name, sep, path = value.partition("=")
    tree = Path(path).resolve()
    if not (sep and name and (tree / "bench" / "store_bench.py").is_file()):
        raise argparse.ArgumentTypeError(f"{value!r}: want NAME=PATH, PATH a checkout of trm")
    return name, tree


def one_run(tree: Path, durability: str) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, durability],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"the run in {tree} failed:\n{done.stderr}")
    figures: list[float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def described(values: Sequence[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"mean {statistics.mean(values):.4f} median {statistics.median(values):.4f} sd {sd:.4f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--durability", choices=DURABILITIES, default="full")
    parser.add_argument("--runs", type=int, default=20, help="runs per tree")
    parser.add_argument(
        "--tree",
        action="append",
        type=named_tree,
        metavar="NAME=PATH",
        help="a checkout to measure (repeatable; default: this one, as main)",
    )
    args = parser.parse_args(argv)
    trees: list[tuple[str, Path]] = args.tree or [("main", HERE.parent)]
    runs: dict[str, list[list[float]]] = {name: [] for name, _ in trees}
    for k in range(args.runs):
        for name, path in trees:
            runs[name].append(one_run(path, args.durability))
            trm, raw = runs[name][-1][:2]
            print(f"run {k + 1} {name}: {trm / raw:.3f}x ({trm:,.0f} / {raw:,.0f} ev/s)")
    print(f"single-event appends at {args.durability}, trm / raw sqlite3, {args.runs} runs each:")
    for name, figures in runs.items():
        wall = [trm / raw for trm, raw, _, _ in figures]
        cpu = [trm_cpu / raw_cpu for _, _, trm_cpu, raw_cpu in figures]
        trm_us = statistics.mean(1e6 / trm for trm, _, _, _ in figures)
        raw_us = statistics.mean(1e6 / raw for _, raw, _, _ in figures)
        print(f"  {name}: wall {described(wall)}; CPU {described(cpu)}")
        print(f"  {' ' * len(name)}  an append: trm {trm_us:.1f} us, raw {raw_us:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
