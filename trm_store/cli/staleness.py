"""What `trm runs` and `trm gates` share: the --stale-after argument, times and ages as text, a
status cell with its STALE mark, and the lines under the table naming stale and marked ones."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from rich.console import Console
from rich.markup import escape

from trm_store.domain._common import json_default

__all__ = [
    "add_stale_options",
    "age_text",
    "print_stale_json",
    "print_stale_summary",
    "seconds_arg",
    "status_text",
    "time_text",
]


_SECONDS_MAX = float(timedelta.max.days * 86400)
"""The longest threshold in whole days a timedelta holds (timedelta.max in seconds rounds up,
as a float, past it)."""


def seconds_arg(text: str) -> float:
    """An argparse `type`: a number of seconds > 0 that a timedelta holds (a threshold reaching
    back before year 1 is refused by the domain, as a one-line error)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= _SECONDS_MAX:  # False for NaN too
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds > 0 and <= {_SECONDS_MAX:.0f}, got {text!r}"
        )
    return value


def add_stale_options(parser: argparse.ArgumentParser, noun: str, default_s: float) -> None:
    """The options `trm {noun}s` shares with its sibling: --db, --json, --stale-after SECONDS
    (default `default_s`) and --mark-stale."""
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--stale-after",
        type=seconds_arg,
        default=default_s,
        metavar="SECONDS",
        help=f"a running {noun} silent this long is stale (default: %(default)g)",
    )
    parser.add_argument(
        "--mark-stale", action="store_true", help=f"record the stale {noun}s as failed (writes)"
    )


def age_text(seconds: float | None) -> str:
    """An age as a few characters (`42s`, `7m`, `3.5h`; `-` for None)."""
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)  # a clock a little behind the recorder's: no "-0s"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def time_text(value: datetime | None) -> str:
    """A UTC time to the second, or `-`."""
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def status_text(status: str, colours: dict[str, str], *, reason: str | None, stale: bool) -> str:
    """The status in its colour, then `(reason)` if given, then a STALE mark if stale."""
    text = f"[{colours.get(status, 'white')}]{status}[/]"
    if reason:
        text += f" ({escape(reason)})"
    if stale:
        text += " [bold yellow]STALE[/]"
    return text


def print_stale_summary(
    console: Console,
    noun: str,
    *,
    stale: Sequence[str],
    marked: Sequence[str],
    stale_after: float,
    condition: str,
) -> None:
    """Under the table of `trm {noun}s`: those marked failed by this call, then those still
    stale (`{n} running {noun}(s) {condition} {stale_after}s`) or that none is."""
    if marked:
        console.print(escape(f"marked stale (now failed): {', '.join(marked)}"))
    if stale:
        console.print(
            f"[yellow]{len(stale)} running {noun}(s) {condition} {stale_after:g}s[/]: "
            f"{escape(', '.join(stale))}; `trm {noun}s --mark-stale` records them as failed"
        )
    elif not marked:
        console.print(f"no stale {noun}s (threshold {stale_after:g}s)")


def print_stale_json(
    url: str,
    stale_after_s: float,
    rows: tuple[str, list[dict[str, Any]]],
    stale: set[str],
    marked: list[str],
    **extra: object,
) -> None:
    """The `--json` document of `trm runs` / `trm gates`: the rows under their name, the stale
    ids, what was marked now, and anything the command adds (ISO 8601 times, no NaN)."""
    name, listed = rows
    document = {
        "store": url,
        "stale_after_s": stale_after_s,
        name: listed,
        "stale": sorted(stale),
        "marked_stale": marked,
        **extra,
    }
    print(json.dumps(document, default=json_default, allow_nan=False))
