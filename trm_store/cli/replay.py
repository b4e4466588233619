"""`trm replay-projections`: rebuild read models from the log, or verify them against a rebuild."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from trm_store.cli.common import progress_bar
from trm_store.store import open_store

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "replay-projections",
        help="rebuild projections from the event log (after a crash or an upgrade)",
        description="Rebuild every projection (or --only NAME) from the event log into scratch "
        "tables and swap them in; with --verify, rebuild into scratch and diff against the live "
        "tables instead (exit 1 on any difference). Memory is bounded by one batch.",
    )
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="rebuild only NAME (repeatable)"
    )
    parser.add_argument(
        "--verify", action="store_true", help="diff a rebuild against the live tables"
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON summary instead of tables"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=args.json)
    with open_store(args.db) as store:
        total = store.head_position()
        with progress_bar(console, transient=args.json) as progress:
            task = progress.add_task("verifying" if args.verify else "rebuilding", total=total)

            def advance(n: int) -> None:
                progress.advance(task, n)

            if args.verify:
                differences = store.verify_projections(progress=advance)
                return _report_verify(console, args.json, store.url, total, differences)
            applied = store.rebuild_projections(args.only, progress=advance)
        return _report_rebuild(console, args.json, store.url, total, applied)


def _report_rebuild(
    console: Console, as_json: bool, url: str, total: int, applied: dict[str, int]
) -> int:
    if as_json:
        print(json.dumps({"store": url, "events": total, "rebuilt": applied}))
        return 0
    table = Table(title=f"rebuilt from {total} events in {url}")
    table.add_column("projection")
    table.add_column("events applied", justify="right")
    for name, count in applied.items():
        table.add_row(name, str(count))
    console.print(table)
    return 0


def _report_verify(
    console: Console, as_json: bool, url: str, total: int, differences: list[str]
) -> int:
    if as_json:
        print(json.dumps({"store": url, "events": total, "differences": differences}))
    elif differences:
        console.print(
            f"[red]{len(differences)} difference(s) between the live projections and a rebuild:"
        )
        for line in differences:
            console.print(f"  - {line}")
        console.print("Run `trm replay-projections` (without --verify) to rebuild them.")
    else:
        console.print(f"[green]all projections equal a rebuild from {total} events ({url})")
    return 1 if differences else 0
