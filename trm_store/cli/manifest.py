"""`trm manifest WORKSPACE`: a workspace's manifest (fields, runs, best version), read-only.

What `get_manifest` returns, as a table or (--json) as the JSON document `export_manifest`
writes: times in ISO 8601.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table
from rich.text import Text

from trm_store.bootstrap import open_store
from trm_store.cli.common import report_console
from trm_store.cli.staleness import time_text
from trm_store.domain._common import json_default
from trm_store.domain.workspace import get_manifest

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "manifest",
        help="show a workspace's manifest (fields, runs, best version)",
        description="Show a workspace's manifest: its fields, the runs recorded in it and the "
        "best version. Read-only.",
    )
    parser.add_argument("workspace_id", metavar="WORKSPACE")
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with open_store(args.db, read_only=True) as store:
        manifest = get_manifest(store, args.workspace_id)
    if args.json:
        print(json.dumps(manifest, default=json_default, allow_nan=False, indent=2))
        return 0
    console = report_console()
    fields = Table(title=Text(f"workspace {manifest['workspace_id']}"), show_header=False)
    for name in ("field", "value"):
        fields.add_column(name)
    for name, value in manifest.items():
        if name in ("runs", "workspace_id"):
            continue
        shown = Text(time_text(value)) if name in ("created_at", "updated_at") else _text(value)
        fields.add_row(Text(name), shown)
    console.print(fields)
    runs = Table(title=Text(f"runs recorded in {manifest['workspace_id']}"))
    for name in ("run", "recorded (UTC)", "fields"):
        runs.add_column(name)
    for run_ in manifest["runs"]:
        rest = {k: v for k, v in run_.items() if k not in ("run_id", "recorded_at")}
        runs.add_row(Text(run_["run_id"]), time_text(run_["recorded_at"]), _text(rest))
    console.print(runs if manifest["runs"] else "no runs recorded")
    return 0


def _text(value: object) -> Text:
    """A value as plain text: rich markup in a recorded string is shown, never interpreted."""
    return Text(value if isinstance(value, str) else json.dumps(value, default=json_default))
