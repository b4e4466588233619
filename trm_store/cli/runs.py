"""`trm runs`: every run with its status, times, predictions and lease, and which look stale.

A run whose process was SIGKILLed reads `running` forever; its lease (heartbeat) ages instead.
A `running` run silent for longer than --stale-after is flagged; --mark-stale appends
`failed(reason="stale")` to each (`mark_stale_runs`). Without --mark-stale the store is opened
read-only: listing (`list_runs`) never writes.
"""

from __future__ import annotations

import argparse
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console
from rich.table import Table

from trm_store.cli.common import report_console
from trm_store.domain.run_leases import mark_stale_runs, stale_runs
from trm_store.domain.run_list import list_runs
from trm_store.store import open_store

__all__ = ["DEFAULT_STALE_AFTER_S", "add_parser", "run"]

DEFAULT_STALE_AFTER_S = 300.0
"""A live `RunLog` refreshes its lease at least every few seconds while it records."""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "runs",
        help="list runs (status, times, predictions, lease) and flag stale ones",
        description="List every run: status, started and ended times, predictions recorded, "
        "host/pid, lease age. A running run silent for more than --stale-after seconds is "
        "flagged stale (its process is presumed dead); --mark-stale records it as failed "
        "(reason `stale`). Read-only unless --mark-stale.",
    )
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--stale-after",
        type=_seconds,
        default=DEFAULT_STALE_AFTER_S,
        metavar="SECONDS",
        help="a running run silent this long is stale (default: %(default)g)",
    )
    parser.add_argument(
        "--mark-stale", action="store_true", help="record the stale runs as failed (writes)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    older_than = timedelta(seconds=args.stale_after)
    with open_store(args.db, read_only=not args.mark_stale) as store:
        now = datetime.now(UTC)
        marked = mark_stale_runs(store, older_than, now=now) if args.mark_stale else []
        stale = {r.run_id for r in stale_runs(store, older_than, now=now)}
        runs = [{**r, "stale": r["run_id"] in stale} for r in list_runs(store, now=now)]
        if args.json:
            print(
                json.dumps(
                    {
                        "store": store.url,
                        "stale_after_s": args.stale_after,
                        "runs": runs,
                        "stale": sorted(stale),
                        "marked_stale": marked,
                    },
                    default=_iso,
                )
            )
        else:
            _print(report_console(), store.url, runs, args.stale_after, marked)
    return 0


def _iso(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if abs(seconds) < 120:
        return f"{seconds:.0f}s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _print(
    console: Console, url: str, runs: list[dict[str, Any]], stale_after: float, marked: list[str]
) -> None:
    if not runs:
        console.print(f"no runs recorded in {url}")
        return
    table = Table(title=f"runs in {url}")
    for name in ("run", "status", "started (UTC)", "ended (UTC)"):
        table.add_column(name)
    table.add_column("predictions", justify="right")
    table.add_column("host/pid")
    table.add_column("lease age", justify="right")
    colours = {"running": "cyan", "completed": "green", "failed": "red"}
    for r in runs:
        status = f"[{colours.get(r['status'], 'white')}]{r['status']}[/]"
        if r["reason"]:
            status += f" ({r['reason']})"
        if r["stale"]:
            status += " [bold yellow]STALE[/]"
        table.add_row(
            r["run_id"],
            status,
            _time(r["started_at"]),
            _time(r["ended_at"]),
            str(r["predictions"]),
            f"{r['host']}/{r['pid']}",
            _age(r["lease_age_s"]),
        )
    console.print(table)
    stale = [r["run_id"] for r in runs if r["stale"]]
    if marked:
        console.print(f"marked stale (now failed): {', '.join(marked)}")
    if stale:
        console.print(
            f"[yellow]{len(stale)} running run(s) silent for more than {stale_after:g}s[/]: "
            f"{', '.join(stale)}; `trm runs --mark-stale` records them as failed"
        )
    elif not marked:
        console.print(f"no stale runs (threshold {stale_after:g}s)")
