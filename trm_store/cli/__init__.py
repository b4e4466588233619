"""The `trm` command line, and the one composition root: the only place that wires trm_store,
trm_llm and trm_gate together (nothing outside `trm_store/cli/` imports those two, or this).

One module per command, holding its arguments and its rendering; what it shows comes from the
domain's queries (`trm_store.domain`):

- `runs`: `trm runs` (`list_runs`, `mark_stale_runs`);
- `gates`: `trm gates` (`list_gates`, `mark_stale_gates`);
- `gate_report`: `trm gate-report` (`read_gate_report`; e-values by `trm_gate`'s conversion);
- `llm_stats`: `trm llm-stats` (`llm_stats`);
- `replay`: `trm replay-projections`;
- `predictions`: `trm predictions` (`read_predictions`);
- `manifest`: `trm manifest` (`get_manifest`);
- `ui`: `trm ui`, the web view (a package: app, pages, charts, templates);
- `export`: `trm export` (`trm_store.domain.tables`; Parquet through `trm_store.frames`);
- `demo`: `trm demo`, the package of the demo's parts (see its docstring);
- `diagnose`: `trm diagnose`, the package of the labelling job (see its docstring);
- `common`: what they share (console, progress bar, argument types, counts, JSON e-values).

A new command is a new module here with `add_parser(commands)` (which sets `run`), listed in
`build_parser`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from trm_store.cli import (
    demo,
    diagnose,
    export,
    gate_report,
    gates,
    llm_stats,
    manifest,
    predictions,
    replay,
    runs,
    ui,
)
from trm_store.errors import StoreError

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trm", description="Keep an LLM optimisation loop's training signal honest."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.add_parser(commands)
    runs.add_parser(commands)
    gates.add_parser(commands)
    predictions.add_parser(commands)
    manifest.add_parser(commands)
    gate_report.add_parser(commands)
    llm_stats.add_parser(commands)
    diagnose.add_parser(commands)
    replay.add_parser(commands)
    export.add_parser(commands)
    ui.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `trm` subcommand; typed store errors become a one-line message and exit code 2."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except StoreError as e:
        print(f"trm: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return code
