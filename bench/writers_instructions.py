"""writers_instructions: CPU instructions per appended event, trm against eventsourcing, counted.

`writers_bench.py` times events/s, which on a shared 2-CPU host swings by 10% and more from run
to run (CPU steal): too much to see a change of a few percent in what an append costs. This
counts instead: each side's writer (`writers_bench.TrmWriter`, `writers_bench.EsWriter`: the
same payload, SQLite at `synchronous=FULL`) runs its jobs (one append of `--events` events to a
fresh stream each) in a child process under valgrind's callgrind, once with `--jobs` J1 and once
with J2 jobs; the difference, divided by (J2 - J1) x events, is the instructions each appended
event costs: Python, pydantic, the JSON encoder, SQLite, libc, every line of both processes but
their start-up and warm-up, which the difference cancels. Not counted: the kernel's work
(the fsync itself) and time spent waiting. Not exact either: stream ids are random (where each
lands in the index), and the same code has counted 74.6k and 78.9k for eventsourcing's event.

One thread, so the figure is CPU per event, not contention: with threads that share one GIL, a
side's events/s is bounded by it (`writers_bench.py`'s thread figures).

    .venv/bin/python bench/writers_instructions.py              # 50-event appends
    .venv/bin/python bench/writers_instructions.py --events 1   # single-event appends

Needs `valgrind` (Debian: `apt-get install valgrind`); each run takes a minute or two. Exit
code 0 whatever the figures: it is a report, not a test.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIDES = ("trm", "eventsourcing")


def child(side: str, jobs: int, events: int, workdir: str) -> None:
    """Run `jobs` appends of `events` events after one warm-up append, on a fresh file."""
    sys.path.insert(0, str(HERE))
    from writers_bench import SIDES as WRITERS
    from writers_bench import EsWriter

    url = f"sqlite:///{workdir}/{side}.db"
    if side == "eventsourcing":
        EsWriter.create_tables(url)
    writer = WRITERS[side](url)
    writer.job(events)
    for _ in range(jobs):
        writer.job(events)
    writer.close()


def counted(side: str, jobs: int, events: int) -> int:
    """Instructions callgrind counted in a child that makes `jobs` appends."""
    with tempfile.TemporaryDirectory(prefix="writers_instructions-") as workdir:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                __file__,
                "--child",
                side,
                str(jobs),
                str(events),
                workdir,
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},  # the same string hashes in every child
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=50, help="events per append (50)")
    parser.add_argument(
        "--jobs", default="10,60", help="the two job counts J1,J2 (10,60); the difference counts"
    )
    parser.add_argument("--child", nargs=4, metavar=("SIDE", "JOBS", "EVENTS", "DIR"))
    args = parser.parse_args(argv)
    if args.child:
        side, jobs, events, workdir = args.child
        child(side, int(jobs), int(events), workdir)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing measured (apt-get install valgrind)")
        return 0
    few, many = (int(n) for n in args.jobs.split(","))
    per_event: dict[str, float] = {}
    for side in SIDES:
        difference = counted(side, many, args.events) - counted(side, few, args.events)
        per_event[side] = difference / ((many - few) * args.events)
        print(f"{side:<14} {per_event[side]:>10,.0f} instructions per appended event", flush=True)
    ratio = per_event["trm"] / per_event["eventsourcing"]
    print(
        f"trm / eventsourcing {ratio:.2f}x the instructions ({args.events}-event appends, "
        f"SQLite full, jobs {few} and {many}; lower is cheaper)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
