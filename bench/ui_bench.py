"""ui_bench: `trm ui` on a store of a million events: each API call and each page's first paint.

The store (built once, then reused with --store PATH) holds runs of predictions written through
`RunLog`, LLM call events through `Store.append_batch`, gates run by `Gate` on scripted arms and
one workspace that records every run with a `final` dual metric per epoch: about `--events`
events in all. `trm ui` serves it as a child process (read-only, as users run it); each API
address is fetched `--rounds` times with httpx (median wall ms), and each page is loaded in
headless Debian chromium, whose `first-contentful-paint` entry (from navigation start, so it
includes the server's time) is the page's first paint. The reference is the same server
answering `GET /static/ui.css` (a static file: its floor) in the same run; each figure is also
printed as a ratio against it. Targets (issue 18): every API call < 200 ms, every first paint
< 1 s.

    .venv/bin/python bench/ui_bench.py --store /tmp/ui1m.db   # 1,000,000 events (~11 min to build)
    .venv/bin/python bench/ui_bench.py --events 100000 --store /tmp/ui100k.db

With --store, an existing file is reused (built by an earlier run) and its projections brought
current first (a projection whose version changed is rebuilt: the UI serves read-only).

Needs the `ui` extra, playwright and chromium (`apt-get install -y chromium`). Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import httpx

from trm_gate import Arm, Gate, QuestionResult
from trm_store import (
    NewEvent,
    RunLog,
    open_store,
    record_run,
    scaffold_workspace,
    write_dual_metric,
)
from trm_store.store import Store

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("gpt-small", "gpt-large", "local-llama")
UNITS_PER_RUN = 500
QUESTIONS_PER_UNIT = 4


def _call(n: int, rng: random.Random) -> dict[str, object]:
    hit = rng.random() < 0.3
    return {
        "call_id": f"c{n}",
        "parent_call_id": None,
        "model": "m",
        "endpoint": "http://127.0.0.1:8765/v1",
        "profile": "strict",
        "cache": "hit" if hit else "miss",
        "cache_salt": None,
        "cache_write": None if hit else "written",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70},
        "ttft_ms": None if hit else rng.uniform(20, 400),
        "max_inter_token_ms": None if hit else rng.uniform(5, 50),
        "latency_ms": rng.uniform(1, 3000),
        "attempts": []
        if hit
        else [
            {
                "n": 1,
                "outcome": "ok",
                "reason": None,
                "status": 200,
                "latency_ms": 12.5,
                "tokens_discarded": 0,
                "sleep_s": None,
            }
        ],
    }


async def _gate(store: Store, gate_id: str, seed: int) -> None:
    units = [f"u{i}" for i in range(200)]
    rng = random.Random(seed)
    better = {u: rng.random() < 0.6 for u in units}

    def arm(snapshot: str, good: bool) -> Arm:
        async def evaluate(unit_ids: Sequence[str]) -> list[QuestionResult]:
            return [
                QuestionResult(f"{u}-q", u, better[u] if good else not better[u], "stop")
                for u in unit_ids
            ]

        return Arm(snapshot, evaluate)

    await Gate(store, block_size=20).run(
        gate_id, units, baseline=arm(f"b{seed}", False), candidate=arm(f"c{seed}", True)
    )


def build(path: Path, events: int) -> None:
    """Fill a store of about `events` events."""
    url = f"sqlite:///{path}"
    rng = random.Random(7)
    per_run = UNITS_PER_RUN * QUESTIONS_PER_UNIT
    calls = events // 6
    runs = max(1, (events - calls) // (per_run + 2))
    with open_store(url) as store:
        scaffold_workspace(store, "bench", skills={}, prompts={})
        for r in range(runs):
            run_id = f"run-{r:03d}"
            with RunLog(store, run_id, config={"epoch": r}) as log:
                for q in range(per_run):
                    correct = rng.random() < 0.7
                    reason = "stop" if rng.random() > 0.02 else "error"
                    log.record_prediction(
                        f"q{q}",
                        unit_id=f"u{q // QUESTIONS_PER_UNIT}",
                        prediction=str(q),
                        correct=None if reason == "error" else correct,
                        stop_reason=reason,
                    )
            record_run(store, "bench", run_id, epoch=r, arm="candidate")
            write_dual_metric(
                store,
                run_id=run_id,
                epoch=r,
                version_kind="final",
                skills_version="s",
                prompts_version=f"p{r}",
                pool="pool",
                hard_acc=rng.uniform(0.5, 0.9),
            )
            print(f"  run {r + 1}/{runs} written", file=sys.stderr, end="\r")
        for start in range(0, calls, 1000):
            batch = [
                (f"llm:{SOURCES[n % 3]}", [NewEvent("llm.call_completed", _call(n, rng))], None)
                for n in range(start, min(calls, start + 1000))
            ]
            store.append_batch(batch)
        for g in range(10):
            asyncio.run(_gate(store, f"gate-{g}", g))
        print(f"\n  {store.head_position():,} events in {path}", file=sys.stderr)


def median_ms(client: httpx.Client, url: str, rounds: int) -> float:
    """Median wall ms of `rounds` GETs, after one warm-up (templates compiled, pages cached)."""
    client.get(url).raise_for_status()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        response.raise_for_status()
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--store", type=Path, help="reuse (or build here) the store file")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=8931)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ui-bench-"))
    path = args.store or folder / "big.db"
    t0 = time.perf_counter()
    if path.exists():
        print(f"reusing {path}", file=sys.stderr)
        with open_store(f"sqlite:///{path}") as store:  # the UI reads current projections only
            rebuilt = store.recover()
            print(f"  {store.head_position():,} events; projections brought current: {rebuilt}")
    else:
        build(path, args.events)
    pages = addresses()
    print(f"store ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {_commit()}, load "
        f"average {os.getloadavg()[0]:.1f} (cpus: {os.cpu_count()})"
    )
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trm_store.cli",
            "ui",
            "--db",
            f"sqlite:///{path}",
            "--port",
            str(args.port),
        ],
        cwd=folder,
    )
    base = f"http://127.0.0.1:{args.port}"
    try:
        with httpx.Client(timeout=60) as client:
            for _ in range(300):
                try:
                    client.get(f"{base}/favicon.ico")
                    break
                except httpx.TransportError:
                    time.sleep(0.2)
            floor = median_ms(client, f"{base}/static/ui.css", args.rounds * 4)
            print(f"\nreference: GET /static/ui.css {floor:.1f} ms (median of {args.rounds * 4})")
            print(f"\n{'address':55s} {'API ms':>8s} {'x ref':>7s} {'paint ms':>9s} {'x ref':>7s}")
            paints = first_paints(base, list(pages), args.rounds)
            for address, name in pages.items():
                api = median_ms(
                    client, f"{base}/api{address if address != '/' else '/overview'}", args.rounds
                )
                paint = paints[address]
                print(
                    f"{name + ' ' + address:55.55s} {api:8.1f} {api / floor:7.1f} "
                    f"{paint:9.1f} {paint / floor:7.1f}"
                )
        print("\ntargets: every API call < 200 ms, every first paint < 1000 ms")
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    finally:
        server.terminate()
        server.wait()
    return 0


def _commit() -> str:
    """The checkout's commit (and `+dirty` with uncommitted changes): what was measured."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode
    return head + ("+dirty" if dirty else "")


def addresses() -> dict[str, str]:
    """The pages measured: each kind, the biggest run's predictions three ways."""
    big = "run-000"
    return {
        "/": "overview",
        "/workspaces/bench": "workspace",
        "/runs": "runs",
        f"/runs/{big}": "run (first page)",
        f"/runs/{big}?sort=unit_id&desc=true&offset=1500": "run (sorted, page 31)",
        f"/runs/{big}?correct=false&stop_reason=stop": "run (filtered)",
        "/gates": "gates",
        "/gates/gate-0": "gate",
        "/llm": "LLM health",
        f"/llm/{quote(SOURCES[0])}": "LLM source",
        "/projections": "projections",
    }


FIRST_PAINT = """new Promise(resolve => {
  new PerformanceObserver(list => {
    const fcp = list.getEntries().find(e => e.name === 'first-contentful-paint');
    if (fcp) { resolve(fcp.startTime); }
  }).observe({type: 'paint', buffered: true});
})"""
"""The page's first-contentful-paint, ms from navigation start (waits for the entry)."""


def first_paints(base: str, addresses: list[str], rounds: int) -> dict[str, float]:
    """Median first-contentful-paint (ms from navigation start) of each page in chromium."""
    from playwright.sync_api import sync_playwright

    out: dict[str, float] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium")
        page = browser.new_page()
        for address in addresses:
            times = []
            page.goto(base + address, wait_until="load")  # warm-up
            for _ in range(rounds):
                page.goto(base + address, wait_until="load")
                times.append(page.evaluate(FIRST_PAINT))
            out[address] = statistics.median(times)
        browser.close()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
