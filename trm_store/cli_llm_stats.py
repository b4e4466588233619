"""`trm llm-stats`: per LLM source, what the governance did (read-only, from `llm_calls`).

Counts come from `llm_stats`; latency and TTFT percentiles are computed here from the call rows
(nearest rank, so each is a latency some call really had). Latency is over answers fetched from
the server (completed, not cache hits), retries and backoff included: a hit costs ~0 ms and a
failed call's time says nothing about the provider's speed.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from trm_store.bootstrap import open_store
from trm_store.cli_common import report_console
from trm_store.domain.errors import UnknownEntityError
from trm_store.domain.llm_calls import llm_calls, llm_stats
from trm_store.store import Store

__all__ = ["add_parser", "percentile", "run", "source_stats"]

TRUNCATED = "truncated_no_done"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "llm-stats",
        help="per LLM source: calls, cache hit rate, retries by reason, truncations, breaker, "
        "latency",
        description="Per LLM source: calls (completed / failed), cache hit rate, retries and "
        "failed attempts by reason, truncated streams caught, `length` finishes, breaker opens, "
        "p50/p95 latency and time to first token. Read-only.",
    )
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--source", help="only this source (stream llm:SOURCE)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with open_store(args.db, read_only=True) as store:
        stats = source_stats(store, source=args.source)
        if args.json:
            print(json.dumps({"store": store.url, "sources": stats}))
        else:
            _print(report_console(), store.url, stats)
    return 0


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank p-th percentile (0 < p <= 100) of `values`; None if there are none."""
    if not 0 < p <= 100:
        raise ValueError(f"p must be in (0, 100], got {p!r}")
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _spread(values: Sequence[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95)}


def source_stats(store: Store, *, source: str | None = None) -> dict[str, dict[str, Any]]:
    """Per source (one, if given: UnknownEntityError when it has no events) the figures shown."""
    counts = llm_stats(store)
    if source is not None:
        if source not in counts:
            known = ", ".join(sorted(counts)) or "none"
            raise UnknownEntityError(
                f"no LLM calls recorded for source {source!r} (known: {known})"
            )
        counts = {source: counts[source]}
    result = {}
    for name, c in sorted(counts.items()):
        rows = llm_calls(store, source=name)
        fetched = [r for r in rows if r["outcome"] == "completed" and not r["cache_hit"]]
        ttfts = [r["ttft_ms"] for r in fetched if r["ttft_ms"] is not None]
        result[name] = {
            "calls": c["calls"],
            "completed": c["completed"],
            "failed": c["failed"],
            "failures_by_error": c["errors"],
            "cache_hits": c["cache_hits"],
            "cache_hit_rate": c["cache_hits"] / c["calls"] if c["calls"] else None,
            "attempts": c["attempts"],
            "retries": c["retries"],
            "failed_attempts_by_reason": c["attempt_reasons"],
            "truncated_streams": c["attempt_reasons"].get(TRUNCATED, 0),
            "length_finishes": sum(r["finish_reason"] == "length" for r in rows),
            "breaker_opened": c["breaker_opened"],
            "latency_ms": _spread([r["latency_ms"] for r in fetched]),
            "ttft_ms": _spread(ttfts),
        }
    return result


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _print(console: Console, url: str, stats: dict[str, dict[str, Any]]) -> None:
    if not stats:
        console.print(f"no LLM calls recorded in {url}")
        return
    table = Table(title=f"LLM calls in {url}")
    table.add_column("source")
    for name in ("calls", "ok", "failed", "cache hit", "retries", "truncated", "length"):
        table.add_column(name, justify="right")
    table.add_column("breaker opens", justify="right")
    for name in ("latency p50/p95 ms", "TTFT p50/p95 ms"):
        table.add_column(name, justify="right")
    for source, s in stats.items():
        rate = "-" if s["cache_hit_rate"] is None else f"{s['cache_hit_rate']:.0%}"
        table.add_row(
            source,
            str(s["calls"]),
            str(s["completed"]),
            str(s["failed"]),
            rate,
            str(s["retries"]),
            str(s["truncated_streams"]),
            str(s["length_finishes"]),
            str(s["breaker_opened"]),
            f"{_ms(s['latency_ms']['p50'])} / {_ms(s['latency_ms']['p95'])}",
            f"{_ms(s['ttft_ms']['p50'])} / {_ms(s['ttft_ms']['p95'])}",
        )
    console.print(table)
    for source, s in stats.items():
        reasons = s["failed_attempts_by_reason"]
        if reasons:
            parts = ", ".join(f"{r} {n}" for r, n in sorted(reasons.items()))
            console.print(f"{source}: failed attempts by reason: {parts}")
        if s["failures_by_error"]:
            parts = ", ".join(f"{e} {n}" for e, n in sorted(s["failures_by_error"].items()))
            console.print(f"{source}: failed calls by error: {parts}")
