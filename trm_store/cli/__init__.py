"""The `trm` command line: one subcommand per operator task, each in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from trm_store.cli import demo, diagnose, gate_report, llm_stats, replay, runs
from trm_store.errors import StoreError

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trm", description="Keep an LLM optimisation loop's training signal honest."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.add_parser(commands)
    runs.add_parser(commands)
    gate_report.add_parser(commands)
    llm_stats.add_parser(commands)
    diagnose.add_parser(commands)
    replay.add_parser(commands)
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
