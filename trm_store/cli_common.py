"""What every `trm` subcommand shares: the report console and the progress bar."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["progress_bar", "report_console"]


def report_console() -> Console:
    """A console for reports: the terminal's width, or 140 columns when piped (no wrapping
    of tables into unreadable columns in logs)."""
    return Console(width=None if sys.stdout.isatty() else 140)


def progress_bar(console: Console, *, transient: bool) -> Progress:
    """A progress bar with a description, the bar, done/total and the elapsed time."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console, transient=transient)
