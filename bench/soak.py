"""Soak: N worker processes run gated evaluations against one fault-injecting server, sharing the
store, the Redis response cache and the Redis breaker, while a supervisor SIGKILLs random workers
at random moments and restarts them. Afterwards every invariant is checked (`soak_check`).

    .venv/bin/python bench/soak.py [--quick] [--backend postgresql|sqlite|both] [--workers 4]
                                   [--seconds S]

Each backend gets a fresh store (a new PostgreSQL schema on 127.0.0.1:5432/test, or a new SQLite
file) and a fresh Redis namespace (`trm:soak:<id>`), all removed afterwards. Both backends share
the Redis response cache and breaker. Exit 1 on any violation, 0 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from soak_check import Findings, check_all
from soak_common import SEED, OutageServer, SoakConfig
from sqlalchemy import create_engine, text

from trm_store import open_store

BENCH = Path(__file__).resolve().parent
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
STOP_GRACE_S = 30.0  # a SIGTERMed worker cancels its gate and exits within this, or is killed


@dataclass(frozen=True)
class Plan:
    """How hard to soak one backend."""

    seconds: float
    workers: int
    kill_every_s: tuple[float, float]
    units: int
    block_size: int
    outage_every_s: float = 8.0
    outage_s: float = 1.5
    probe_timeout_s: float = 3.0


@dataclass
class Result:
    """One backend's soak: its findings and what the supervisor saw."""

    backend: str
    findings: Findings
    elapsed_s: float
    kills: int = 0
    final_kills: int = 0
    crashed: list[str] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)


@contextmanager
def fresh_store(backend: str, workdir: Path) -> Iterator[str]:
    """A URL to a brand-new store, removed afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{workdir / 'soak.db'}"
        return
    schema = "soak_" + uuid.uuid4().hex[:12]
    engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        engine.dispose()


class Supervisor:
    """Keeps `workers` processes running, SIGKILLing a random one now and then."""

    def __init__(self, cfg_path: Path, plan: Plan, rng: random.Random) -> None:
        self.cfg_path, self.plan, self.rng = cfg_path, plan, rng
        self.workdir = cfg_path.parent
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.incarnation: dict[int, int] = {}
        self.kills = 0
        self.crashed: list[str] = []

    def spawn(self, *args: str, name: str) -> subprocess.Popen[bytes]:
        with open(self.workdir / f"stderr-{name}.txt", "wb") as err:
            return subprocess.Popen(
                [sys.executable, str(BENCH / "soak_worker.py"), *args],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def start(self, i: int) -> None:
        n = self.incarnation[i] = self.incarnation.get(i, -1) + 1
        self.procs[i] = self.spawn("worker", str(self.cfg_path), str(i), str(n), name=f"w{i}-{n}")

    def run(self, seconds: float) -> None:
        for i in range(self.plan.workers):
            self.start(i)
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            time.sleep(min(self.rng.uniform(*self.plan.kill_every_s), max(0.0, end - now)))
            self._restart_crashed()
            if time.monotonic() >= end:
                break
            victim = self.rng.randrange(self.plan.workers)
            self.procs[victim].kill()
            self.procs[victim].wait()
            self.kills += 1
            self.start(victim)

    def _restart_crashed(self) -> None:
        for i, proc in self.procs.items():
            if proc.poll() is not None:
                name = f"w{i}-{self.incarnation[i]}"
                tail = (self.workdir / f"stderr-{name}.txt").read_text()[-600:]
                self.crashed.append(f"{name} exited {proc.returncode}: {tail}")
                self.start(i)

    def stop(self) -> int:
        """SIGTERM every worker (it cancels its gate); SIGKILL any still up after the grace."""
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        deadline, killed = time.monotonic() + STOP_GRACE_S, 0
        for i, proc in self.procs.items():
            try:
                code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                killed += 1
                continue
            if code not in (0, -signal.SIGTERM):  # -SIGTERM: told before its handler was set
                name = f"w{i}-{self.incarnation[i]}"
                tail = (self.workdir / f"stderr-{name}.txt").read_text()[-600:]
                self.crashed.append(f"{name} exited {code} on SIGTERM: {tail}")
        return killed


def soak_backend(backend: str, plan: Plan, seed: int) -> Result:
    """One backend's soak, end to end; every resource it made is removed before it returns."""
    workdir = Path(tempfile.mkdtemp(prefix=f"trm-soak-{backend}-"))
    namespace = f"trm:soak:{uuid.uuid4().hex[:12]}"
    server = OutageServer(every_s=plan.outage_every_s, outage_s=plan.outage_s)
    stop_server = server.run_in_thread()
    try:
        with fresh_store(backend, workdir) as url:
            cfg = SoakConfig(
                backend=backend,
                store_url=url,
                redis_url=REDIS_URL,
                namespace=namespace,
                base_url=server.base_url,
                model=server.model.name,
                workdir=str(workdir),
                units=plan.units,
                block_size=plan.block_size,
                probe_timeout_s=plan.probe_timeout_s,
            )
            cfg_path = workdir / "config.json"
            cfg.save(cfg_path)
            open_store(url).close()  # created once, before the workers race to open it
            sup = Supervisor(cfg_path, plan, random.Random(seed))
            follower = sup.spawn("follow", str(cfg_path), name="follower")
            started = time.monotonic()
            sup.run(plan.seconds)
            final_kills = sup.stop()
            elapsed = time.monotonic() - started
            with open_store(url) as store:
                _release_follower(workdir, store.head_position())
                follower.wait(timeout=120)
                findings = check_all(cfg, store, SEED)
            if follower.returncode != 0:
                findings.add("follower", [f"follower exited {follower.returncode}"])
            findings.add("workers exited only when killed or told", sup.crashed)
            server_figures = {"requests": server.request_count, **server.injected}
            return Result(
                backend, findings, elapsed, sup.kills, final_kills, sup.crashed, server_figures
            )
    finally:
        stop_server()
        _drop_redis(namespace)
        shutil.rmtree(workdir, ignore_errors=True)


def _release_follower(workdir: Path, head: int) -> None:
    tmp = workdir / "follow-until.tmp"
    tmp.write_text(str(head))
    os.replace(tmp, workdir / "follow-until")


def _drop_redis(namespace: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        names = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        for i in range(0, len(names), 500):
            client.delete(*names[i : i + 500])
    finally:
        client.close()


def report(result: Result, plan: Plan) -> None:
    f, s = result.findings.figures, result.elapsed_s
    print(f"== {result.backend}: {plan.workers} workers, {s:.1f} s")
    print(
        f"   events {f['events']} ({f['events'] / s:.1f}/s; {f['acked']} acknowledged, checked), "
        f"LLM calls {f['llm_calls']} "
        f"({f['llm_calls'] / s:.1f}/s), HTTP requests {result.server.get('requests', 0)}"
    )
    print(
        f"   kills {result.kills} (+{result.final_kills} at the end), gates {f['gates']} "
        f"({f['gates_decided']} decided), runs {f['runs']} ({f['marked_stale']} marked stale)"
    )
    faults = {k: v for k, v in result.server.items() if k != "requests"}
    print(f"   faults injected {sum(faults.values())}: {dict(sorted(faults.items()))}")
    print(
        f"   breaker: {f['half_open_windows']} half-open windows, {f['probes']} probes "
        f"(+{f['local_probes']} on local state while Redis was unreachable), "
        f"{f['breaker_events']} breaker_changed events; cache entries {f['cache_entries']}, "
        f"baseline units {f['baseline_units']}"
    )
    for check, problems in result.findings.violations.items():
        mark = "ok  " if not problems else "FAIL"
        print(f"   {mark} {check}" + ("" if not problems else f": {len(problems)}"))
        for p in problems[:5]:
            print(f"        {p}")


def parse(argv: Sequence[str] | None) -> tuple[list[str], Plan]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~25 s per backend (the CI check)")
    ap.add_argument("--backend", choices=("postgresql", "sqlite", "both"), default="both")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, help="soak time per backend (default 25 / 120)")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error("--workers must be >= 1")
    seconds = args.seconds if args.seconds is not None else (25.0 if args.quick else 120.0)
    kill_every = (2.0, 4.0) if args.quick else (2.0, 6.0)
    plan = Plan(seconds, args.workers, kill_every, units=24, block_size=6)
    backends = ["postgresql", "sqlite"] if args.backend == "both" else [args.backend]
    return backends, plan


def main(argv: Sequence[str] | None = None) -> int:
    backends, plan = parse(argv)
    # The server's peers are SIGKILLed mid-stream on purpose: asyncio's complaints about
    # writing to their dead sockets are expected, not news.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    results = []
    for i, backend in enumerate(backends):
        result = soak_backend(backend, plan, seed=i)
        report(result, plan)
        results.append(result)
    violations = sum(r.findings.count for r in results)
    print(f"violations: {violations}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
