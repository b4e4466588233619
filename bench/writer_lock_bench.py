"""writer_lock_bench: how processes share one SQLite file's writer lock, against the kernel's own
blocking `flock`.

`trm_store.sqlite_writer_lock` polls `flock(LOCK_EX | LOCK_NB)` with sleeps, because a blocking
`flock` cannot give up at the busy timeout. The reference is that blocking `flock` on the same
file (no timeout, no polling: the kernel wakes a waiter when the holder unlocks), run the same
way in the same run. Each of N processes loops for a few seconds: take the lock, hold it (a
transaction), release, think (the next job's preparation). Reported per side: acquisitions (the
lock's throughput), their split between processes (fairness), and each acquisition's wait
(p50, p99, worst).

    .venv/bin/python bench/writer_lock_bench.py             # 4 and 3 processes, 3 s each
    .venv/bin/python bench/writer_lock_bench.py --seconds 1

Exit code 0 whatever the figures: it is a report, not a test.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from trm_store.sqlite_writer_lock import WriterLock

SHAPES = [(4, 0.002, 0.001), (3, 0.001, 0.0003), (2, 0.0005, 0.0002)]
"""(processes, hold s, think s): 4 processes holding 2 ms, 3 holding 1 ms, 2 holding 0.5 ms."""


def worker(side: str, path: str, hold: float, think: float, until: float) -> None:
    """Loop until `until` (wall clock): acquire, hold, release, think; print the waits."""
    waits: list[float] = []
    if side == "trm":
        lock = WriterLock(path, 60.0)
        acquire, release = lock.acquire, lock.release
    else:
        fd = os.open(f"{path}-writer", os.O_RDWR | os.O_CREAT, 0o644)

        def acquire() -> None:
            fcntl.flock(fd, fcntl.LOCK_EX)

        def release() -> None:
            fcntl.flock(fd, fcntl.LOCK_UN)

    cpu = time.process_time()
    while time.time() < until:
        started = time.monotonic()
        acquire()
        waits.append(time.monotonic() - started)
        time.sleep(hold)
        release()
        time.sleep(think)
    print(json.dumps({"waits": waits, "cpu": time.process_time() - cpu}))


def run(side: str, path: str, procs: int, hold: float, think: float, seconds: float) -> dict:
    until = time.time() + 0.5 + seconds  # every process started before the first acquire
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", side, path, str(hold), str(think), str(until)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(procs)
    ]
    results = [json.loads(child.communicate()[0]) for child in children]
    waits = sorted(w for r in results for w in r["waits"])

    def at(q: float) -> float:
        return waits[min(len(waits) - 1, int(q * len(waits)))] * 1000

    return {
        "acquisitions": len(waits),
        "split": [len(r["waits"]) for r in results],
        "p50": at(0.5),
        "p99": at(0.99),
        "max": waits[-1] * 1000,
        "cpu": sum(r["cpu"] for r in results),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per shape and side (3)")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        side, path, hold, think, until = args.worker
        worker(side, path, float(hold), float(think), float(until))
        return 0
    with tempfile.TemporaryDirectory(prefix="writer_lock_bench-") as tmp:
        path = str(Path(tmp) / "bench.db")
        for procs, hold, think in SHAPES:
            got = {
                side: run(side, path, procs, hold, think, args.seconds) for side in ("trm", "flock")
            }
            trm, ref = got["trm"], got["flock"]
            print(
                f"{procs} processes, hold {hold * 1000:.1f} ms, think {think * 1000:.1f} ms "
                f"({args.seconds:.0f} s): acquisitions trm / blocking flock "
                f"{trm['acquisitions'] / ref['acquisitions']:.2f}x"
            )
            for side, r in got.items():
                print(
                    f"  {side:<6} {r['acquisitions']:>6} acquisitions {r['split']}, wait p50 "
                    f"{r['p50']:6.2f} p99 {r['p99']:6.1f} max {r['max']:6.1f} ms, "
                    f"CPU {r['cpu']:.2f} s"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
