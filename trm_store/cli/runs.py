"""`trm runs`: every run with its status, times, predictions and lease, and which look stale.

A run whose process was SIGKILLed reads `running` forever; its lease (heartbeat) ages instead.
A `running` run silent for longer than --stale-after is flagged; --mark-stale appends
`failed(reason="stale")` to each (`mark_stale_runs`); a run whose process on this host is gone is
stale at once. `--fail RUN_ID [--reason TEXT]` fails one running run by hand (`fail_run`).
Without --mark-stale or --fail the store is opened read-only: listing (`list_runs`) never writes.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trm_store.bootstrap import open_store
from trm_store.cli.common import report_console
from trm_store.cli.staleness import (
    add_stale_options,
    age_text,
    print_stale_json,
    print_stale_summary,
    status_text,
    time_text,
)
from trm_store.domain.run_leases import fail_run, mark_stale_runs, stale_runs
from trm_store.domain.run_list import list_runs

__all__ = ["DEFAULT_STALE_AFTER_S", "add_parser", "run"]

DEFAULT_STALE_AFTER_S = 300.0
"""A live `RunLog` refreshes its lease at least every few seconds while it records."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "runs",
        help="list runs (status, times, predictions, lease) and flag stale ones",
        description="List every run: status, started and ended times, predictions recorded, "
        "host/pid, lease age. A running run silent for more than --stale-after seconds is "
        "flagged stale (its process is presumed dead); --mark-stale records it as failed "
        "(reason `stale`). Read-only unless --mark-stale.",
    )
    add_stale_options(parser, "run", DEFAULT_STALE_AFTER_S)
    parser.add_argument(
        "--fail", metavar="RUN_ID", help="record this running run as failed (reason `operator`)"
    )
    parser.add_argument(
        "--reason", metavar="TEXT", help="with --fail: the failure's text (default: by an operator)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.reason is not None and args.fail is None:
        print("trm runs: --reason goes with --fail RUN_ID", file=sys.stderr)
        return 2
    older_than = timedelta(seconds=args.stale_after)
    with open_store(args.db, read_only=not (args.mark_stale or args.fail)) as store:
        now = datetime.now(UTC)
        if args.fail is not None:
            fail_run(store, args.fail, reason=args.reason, now=now)
            if not args.json:
                print(f"run {args.fail} is now failed (operator)")
        marked = mark_stale_runs(store, older_than, now=now) if args.mark_stale else []
        stale = {r.run_id for r in stale_runs(store, older_than, now=now)}
        runs = [{**r, "stale": r["run_id"] in stale} for r in list_runs(store, now=now)]
        if args.json:
            rows = ("runs", runs)
            print_stale_json(store.url, args.stale_after, rows, stale, marked, failed=args.fail)
        else:
            _print(report_console(), store.url, runs, args.stale_after, marked)
    return 0


def _print(
    console: Console, url: str, runs: list[dict[str, Any]], stale_after: float, marked: list[str]
) -> None:
    if not runs:
        console.print(f"no runs recorded in {escape(url)}")
        return
    table = Table(title=f"runs in {escape(url)}")
    for name in ("run", "status", "started (UTC)", "ended (UTC)"):
        table.add_column(name)
    table.add_column("predictions", justify="right")
    table.add_column("host/pid")
    table.add_column("lease age", justify="right")
    colours = {"running": "cyan", "completed": "green", "failed": "red"}
    for r in runs:
        table.add_row(
            escape(r["run_id"]),
            status_text(r["status"], colours, reason=r["reason"], stale=r["stale"]),
            time_text(r["started_at"]),
            time_text(r["ended_at"]),
            str(r["predictions"]),
            escape(f"{r['host']}/{r['pid']}"),
            age_text(r["lease_age_s"]),
        )
    console.print(table)
    stale = [r["run_id"] for r in runs if r["stale"]]
    print_stale_summary(
        console,
        "run",
        stale=stale,
        marked=marked,
        stale_after=stale_after,
        condition="silent for more than",
    )
