"""`trm gates`: every gate with its status, verdict and age, and which look stale.

A gate whose process was killed would read `running` forever. A `running` gate whose process on
this host is gone, or that wrote nothing for longer than --stale-after, is flagged; --mark-stale
appends `gate.failed(reason="stale")` to each (`mark_stale_gates`). Without --mark-stale the
store is opened read-only: listing (`list_gates`) never writes.
"""

from __future__ import annotations

import argparse
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
from trm_store.domain.gate_leases import mark_stale_gates, stale_gates
from trm_store.domain.gates import list_gates

__all__ = ["DEFAULT_STALE_AFTER_S", "add_parser", "run"]

DEFAULT_STALE_AFTER_S = 3600.0
"""A gate writes one event per block: the threshold must exceed the longest block."""

_SHOWN = (
    *("gate_id", "status", "verdict", "reason", "blocks", "units_evaluated", "wins", "losses"),
    *("ties", "started_at", "decided_at", "last_event_at", "host", "pid"),
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "gates",
        help="list gates (status, verdict, age) and flag stale ones",
        description="List every gate, most recent first: status, verdict, blocks, W/L/ties, "
        "started and ended times, age of its last event. A running gate whose process on this "
        "host is gone, or silent for more than --stale-after seconds, is flagged stale; "
        "--mark-stale records it as failed (reason `stale`). Read-only unless --mark-stale.",
    )
    add_stale_options(parser, "gate", DEFAULT_STALE_AFTER_S)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    older_than = timedelta(seconds=args.stale_after)
    with open_store(args.db, read_only=not args.mark_stale) as store:
        now = datetime.now(UTC)
        marked = mark_stale_gates(store, older_than, now=now) if args.mark_stale else []
        stale = {g.gate_id for g in stale_gates(store, older_than, now=now)}
        gates = [
            {
                **{k: g[k] for k in _SHOWN},
                "age_s": round((now - g["last_event_at"]).total_seconds(), 3),
                "stale": g["gate_id"] in stale,
            }
            for g in list_gates(store)
        ]
        if args.json:
            print_stale_json(store.url, args.stale_after, ("gates", gates), stale, marked)
        else:
            _print(report_console(), store.url, gates, args.stale_after, marked)
    return 0


def _print(
    console: Console, url: str, gates: list[dict[str, Any]], stale_after: float, marked: list[str]
) -> None:
    if not gates:
        console.print(f"no gates recorded in {escape(url)}")
        return
    table = Table(title=f"gates in {escape(url)}")
    for name in ("gate", "status", "verdict", "blocks", "W/L/T", "started (UTC)", "ended (UTC)"):
        table.add_column(name)
    table.add_column("age", justify="right")
    colours = {"running": "cyan", "decided": "green", "failed": "red"}
    for g in gates:
        table.add_row(
            escape(g["gate_id"]),
            status_text(g["status"], colours, reason=None, stale=g["stale"]),
            escape(g["verdict"] or "-"),
            str(g["blocks"]),
            f"{g['wins']}/{g['losses']}/{g['ties']}",
            time_text(g["started_at"]),
            time_text(g["decided_at"]),
            age_text(g["age_s"]),
        )
    console.print(table)
    stale = [g["gate_id"] for g in gates if g["stale"]]
    print_stale_summary(
        console,
        "gate",
        stale=stale,
        marked=marked,
        stale_after=stale_after,
        condition="whose process is gone or silent for more than",
    )
