"""real_server: `trm demo` and `trm diagnose` at their defaults against a real server, checked.

For anyone with an OpenAI-compatible server (REAL_SERVER.md builds llama-cpp-python's with
SmolLM2-135M-Instruct on loopback). In a fresh temporary folder it runs, as a user would:

1. `trm demo --base-url URL --model M --json` with no other flag; checks the verdict is a
   decision (accept, reject or inconclusive, not infra_abort), that at most 10% of the questions
   asked were unparseable (stop reason `parse_error`), and that it took under 10 minutes;
2. `trm diagnose` at its defaults on 30 items of the demo's baseline run; checks every item was
   diagnosed (none failed, none left).

    .venv/bin/python bench/real_server.py http://127.0.0.1:8765/v1 [--model smol]

Prints each figure against its target and exits 1 if one is missed. Not a test: CI has no
server.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trm_store import open_store
from trm_store.domain.runs import read_predictions

DEMO_LIMIT_S = 600.0
UNPARSEABLE_MAX = 0.10
ITEMS = 30


def trm(folder: Path, *args: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "TRM_", "REDIS_"))}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "trm_store.cli", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("base_url")
    parser.add_argument("--model", default="smol")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="trm-real-"))
    url = f"sqlite:///{folder / 'trm.db'}"
    misses = []

    demo, took = trm(
        folder,
        "demo",
        "--base-url",
        args.base_url,
        "--model",
        args.model,
        "--json",
        timeout=DEMO_LIMIT_S * 3,
    )
    if not demo.stdout.strip():
        print(demo.stderr[-3000:])
        print(f"trm demo printed no summary (exit {demo.returncode})")
        return 1
    summary = json.loads(demo.stdout)
    stops: dict[str, int] = {}
    for arm in summary["arms"].values():
        for reason, n in arm["stop_reasons"].items():
            stops[reason] = stops.get(reason, 0) + n
    asked = sum(stops.values())
    unparseable = stops.get("parse_error", 0) / asked if asked else 1.0
    verdict = summary["verdict"]
    print(f"store: {url}")
    print(
        f"demo verdict: {verdict} ({summary['reason']}); W/L/T {summary['wins']}/"
        f"{summary['losses']}/{summary['ties']}, {summary['units_evaluated']} units"
    )
    print(f"demo questions asked: {asked}, stop reasons {stops}")
    print(f"demo unparseable share: {unparseable:.1%} (target <= {UNPARSEABLE_MAX:.0%})")
    print(f"demo time: {took:.0f} s (target < {DEMO_LIMIT_S:.0f} s)")
    if summary.get("infra_cause"):
        print(f"demo infra cause: {summary['infra_cause']}")
    if verdict == "infra_abort":
        misses.append("the demo ended infra_abort")
    if unparseable > UNPARSEABLE_MAX:
        misses.append(f"{unparseable:.1%} of the questions were unparseable")
    if took >= DEMO_LIMIT_S:
        misses.append(f"the demo took {took:.0f} s")

    run_id = summary["arms"]["baseline"]["run_id"]
    with open_store(url, read_only=True) as store:
        rows = [p for p in read_predictions(store, run_id) if p["prediction"] is not None]
    items = folder / "items.jsonl"
    with items.open("w", encoding="utf-8") as out:
        for p in rows[:ITEMS]:
            fields = {
                "question": p.get("question", p["question_id"]),
                "expected": p.get("expected"),
                "answer": p["prediction"],
            }
            out.write(json.dumps({"question_id": p["question_id"], **fields}) + "\n")
    n_items = min(ITEMS, len(rows))
    diagnose, took = trm(
        folder,
        "diagnose",
        "--run-id",
        run_id,
        "--items",
        str(items),
        "--base-url",
        args.base_url,
        "--model",
        args.model,
        "--json",
        timeout=1800,
    )
    result = json.loads(diagnose.stdout) if diagnose.stdout.strip() else {}
    done = result.get("diagnosed", 0) + result.get("skipped_done", 0)
    print(
        f"diagnose: {done} of {n_items} items diagnosed in {took:.0f} s, exit "
        f"{diagnose.returncode}; tiers {result.get('tiers')}, failed {result.get('failed')}"
    )
    if done != n_items or diagnose.returncode != 0:
        misses.append(f"diagnose finished {done} of {n_items} items (exit {diagnose.returncode})")
    print("result: " + ("every target met" if not misses else "MISSED: " + "; ".join(misses)))
    return 1 if misses else 0


if __name__ == "__main__":
    raise SystemExit(main())
