"""`trm llm-stats`: per LLM source, what the governance did (read-only, from `llm_calls`).

The figures are `trm_store.domain.llm_calls.llm_stats` (and `token_totals` for `--run` /
`--gate`); this module parses arguments and shows them, as a table or as JSON.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trm_store.bootstrap import open_store
from trm_store.cli.common import report_console
from trm_store.domain.llm_calls import LLMSourceStats, Tokens, TokenTotals, llm_stats, token_totals

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "llm-stats",
        help="per LLM source: calls, cache hit rate, retries by reason, truncations, breaker, "
        "latency",
        description="Per LLM source: calls (completed / failed), cache hit rate, retries and "
        "failed attempts by reason, truncated streams caught, `length` finishes, breaker opens, "
        "the concurrency limit's path, tokens, p50/p95 latency and time to first token; with "
        "--run / --gate, the tokens of those runs (each an arm) and of the gate. Read-only.",
    )
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--source", help="only this source (stream llm:SOURCE)")
    parser.add_argument(
        "--run",
        action="append",
        dest="runs",
        default=[],
        metavar="RUN_ID",
        help="token totals of this run (the calls its predictions name); repeatable",
    )
    parser.add_argument(
        "--gate",
        metavar="GATE_ID",
        help="token totals of this gate: the runs whose config names it, each an arm",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with open_store(args.db, read_only=True) as store:
        stats = llm_stats(store, source=args.source)
        tokens = None
        if args.runs or args.gate is not None:
            tokens = token_totals(store, gate_id=args.gate, run_ids=args.runs)
        if args.json:
            doc: dict[str, Any] = {
                "store": store.url,
                "sources": {name: _as_json(s) for name, s in stats.items()},
            }
            if tokens is not None:
                doc["tokens"] = tokens
            print(json.dumps(doc, allow_nan=False))
        else:
            console = report_console()
            _print(console, store.url, stats)
            if tokens is not None:
                _print_tokens(console, tokens)
    return 0


def _as_json(s: LLMSourceStats) -> dict[str, Any]:
    """The figures `--json` prints, under the names it has always used."""
    return {
        "calls": s["calls"],
        "completed": s["completed"],
        "failed": s["failed"],
        "failures_by_error": s["errors"],
        "cache_hits": s["cache_hits"],
        "cache_hit_rate": s["cache_hit_rate"],
        "attempts": s["attempts"],
        "retries": s["retries"],
        "failed_attempts_by_reason": s["attempt_reasons"],
        "truncated_streams": s["truncated_streams"],
        "length_finishes": s["length_finishes"],
        "breaker_opened": s["breaker_opened"],
        "overload_retries": s["overload_retries"],
        "last_error": s["last_error"],
        "concurrency_limit": s["limit"],
        "tokens": s["tokens"],
        "latency_ms": s["latency_ms"],
        "ttft_ms": s["ttft_ms"],
    }


def _limit(s: LLMSourceStats) -> str:
    limit = s["limit"]
    if limit["current"] is None:
        return "-"
    return f"{limit['current']} ({limit['min']}-{limit['max']})"


def _tokens_text(t: Tokens) -> str:
    return (
        f"{t['total']} ({t['prompt']} prompt + {t['completion']} completion, {t['calls']} answers)"
    )


def _print_tokens(console: Console, tokens: TokenTotals) -> None:
    for run in tokens["runs"]:
        arm = f" ({run['arm']})" if run["arm"] else ""
        console.print(escape(f"run {run['run_id']}{arm}: tokens {_tokens_text(run['tokens'])}"))
    what = f"gate {tokens['gate_id']}" if tokens["gate_id"] is not None else "these runs"
    console.print(escape(f"{what}: tokens {_tokens_text(tokens['total'])}"))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _print(console: Console, url: str, stats: dict[str, LLMSourceStats]) -> None:
    if not stats:
        console.print(f"no LLM calls recorded in {escape(url)}")
        return
    table = Table(title=f"LLM calls in {escape(url)}")
    table.add_column("source")
    for name in ("calls", "ok", "failed", "cache hit", "retries", "truncated", "length"):
        table.add_column(name, justify="right")
    table.add_column("breaker opens", justify="right")
    table.add_column("limit now (min-max)", justify="right")
    table.add_column("tokens", justify="right")
    for name in ("latency p50/p95 ms", "TTFT p50/p95 ms"):
        table.add_column(name, justify="right")
    for source, s in stats.items():
        rate = "-" if s["cache_hit_rate"] is None else f"{s['cache_hit_rate']:.0%}"
        table.add_row(
            escape(source),
            str(s["calls"]),
            str(s["completed"]),
            str(s["failed"]),
            rate,
            str(s["retries"]),
            str(s["truncated_streams"]),
            str(s["length_finishes"]),
            str(s["breaker_opened"]),
            _limit(s),
            str(s["tokens"]["total"]),
            f"{_ms(s['latency_ms']['p50'])} / {_ms(s['latency_ms']['p95'])}",
            f"{_ms(s['ttft_ms']['p50'])} / {_ms(s['ttft_ms']['p95'])}",
        )
    console.print(table)
    for source, s in stats.items():
        if s["limit"]["path"]:
            path = " -> ".join(str(n) for n in s["limit"]["path"])
            console.print(
                escape(
                    f"{source}: concurrency limit {path}; {s['overload_retries']} attempts "
                    "retried after an overload"
                )
            )
        reasons = s["attempt_reasons"]
        if reasons:
            parts = ", ".join(f"{r} {n}" for r, n in sorted(reasons.items()))
            console.print(escape(f"{source}: failed attempts by reason: {parts}"))
        if s["errors"]:
            parts = ", ".join(f"{e} {n}" for e, n in sorted(s["errors"].items()))
            console.print(escape(f"{source}: failed calls by error: {parts}"))
        if s["last_error"]:
            console.print(escape(f"{source}: last error: {s['last_error']}"))
