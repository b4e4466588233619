"""What every `trm` subcommand shares: the report console, the progress bar, integer arguments,
counts as text, and e-values in JSON."""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from collections.abc import Callable, Mapping

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["counts_text", "int_in_range", "json_e_value", "progress_bar", "report_console"]


def report_console() -> Console:
    """A console for reports: the terminal's width, or 140 columns when piped (no wrapping
    of tables into unreadable columns in logs)."""
    return Console(width=None if sys.stdout.isatty() else 140)


def progress_bar(console: Console, *, transient: bool) -> Progress:
    """A progress bar with a description, the bar, done/total, the elapsed time and an ETA
    (from the rate so far; blank until there is a total and a rate)."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=console, transient=transient)


def int_in_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse `type` accepting an integer in [low, high] (no upper bound when high is
    None): a bad value is a usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    return parse


def counts_text(counts: Mapping[str, int], *, most_first: bool = False) -> str:
    """`name n, name n`: by name, or (most_first) the largest count first."""
    ordered = Counter(counts).most_common() if most_first else sorted(counts.items())
    return ", ".join(f"{name} {n}" for name, n in ordered)


def json_e_value(e_value: float) -> float | None:
    """An e-value as the `--json` outputs give it: the number, or null for +inf (exp of a log
    e-value beyond ~709 overflows a float, and JSON has no infinity)."""
    return e_value if math.isfinite(e_value) else None
