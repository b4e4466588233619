"""writers_cpu: where 4 writer processes' time goes on PostgreSQL, trm against eventsourcing.

`writers_bench.py` gives events/s; this gives what each 50-event append costs in CPU, on the
client (the 4 worker processes' own user + system time, `getrusage`) and on the server (every
`postgres` process's, read from `/proc`, so the checkpointer and WAL writer count too), and how
busy the machine's CPUs were (`/proc/stat`). The same workload as `writers_bench.py`'s
"4 processes x 50, 200-job rounds" (its `Side` and `TrmWriter`/`EsWriter`), sides alternating.
A machine whose CPUs are not all busy while writers queue for a lock is waiting: for a client
that holds the lock, or for the disk.

    .venv/bin/python bench/writers_cpu.py              # 2 runs a side of 600 appends
    .venv/bin/python bench/writers_cpu.py --runs 4 --jobs 1000

Linux only (`/proc`). Exit code 0 whatever the figures: a report, not a test.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import writers_bench as wb

EVENTS = 50
WORKERS = 4


def server_cpu() -> float:
    """CPU seconds used so far by every process named postgres on this machine."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        if "postgres" in text[text.index("(") + 1 : text.rindex(")")]:
            fields = text[text.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime in ticks
    return total / os.sysconf("SC_CLK_TCK")


def busy_ticks() -> tuple[int, int]:
    """(busy, all) CPU ticks of the machine so far."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # less idle and iowait


def own_cpu() -> tuple[int, float]:
    """A worker's pid and CPU seconds so far."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return os.getpid(), used.ru_utime + used.ru_stime


def run(side: str, url: str, jobs: int) -> str:
    with ProcessPoolExecutor(
        WORKERS,
        mp_context=get_context("spawn"),
        initializer=wb._open_in_process,
        initargs=(side, url),
    ) as pool:
        seen: set[int] = set()
        while len(seen) < WORKERS:  # every worker opened and warm
            held = [pool.submit(wb._job_in_process, EVENTS, 0.5) for _ in range(WORKERS)]
            seen.update(f.result() for f in held)
        for f in [pool.submit(wb._job_in_process, EVENTS) for _ in range(200)]:
            f.result()

        def clients() -> dict[int, float]:
            found: dict[int, float] = {}
            while len(found) < WORKERS:
                pid, cpu = pool.submit(own_cpu).result()
                found[pid] = cpu
            return found

        before, server, busy, started = clients(), server_cpu(), busy_ticks(), time.perf_counter()
        for f in [pool.submit(wb._job_in_process, EVENTS) for _ in range(jobs)]:
            f.result()
        took = time.perf_counter() - started
        server = server_cpu() - server
        busy_now, all_now = (now - then for now, then in zip(busy_ticks(), busy, strict=True))
        after = clients()
    client = sum(after[pid] - before[pid] for pid in after)
    return (
        f"{side:<14} {jobs * EVENTS / took:>8,.0f} ev/s   CPU an append: client "
        f"{client / jobs * 1e3:.3f} ms, server {server / jobs * 1e3:.3f} ms   "
        f"CPUs busy {busy_now / max(1, all_now) * 100:.0f}%"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs a side (default 2)")
    parser.add_argument("--jobs", type=int, default=600, help="appends a run (default 600)")
    args = parser.parse_args(argv)
    with wb.pg_urls() as urls:
        if urls is None:
            print("PostgreSQL: unreachable")
            return 0
        wb.EsWriter.create_tables(urls["eventsourcing"])
        for k in range(args.runs):
            sides = ["trm", "eventsourcing"] if k % 2 == 0 else ["eventsourcing", "trm"]
            for side in sides:
                print(run(side, urls[side], args.jobs), flush=True)
    print(f"{WORKERS} processes, {EVENTS}-event appends; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
