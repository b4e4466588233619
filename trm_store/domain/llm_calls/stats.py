"""The one aggregation of LLM calls: per source, what the governance did, from `llm_calls`.

`trm llm-stats`, the demo's report and anything later (a web view) show these figures; only how
they show them differs. Latency and time to first token are over the answers fetched from the
server (completed, not cache hits), retries and backoff included: a hit costs ~0 ms and a failed
call's time says nothing about the provider's speed. Percentiles are nearest rank, so each is a
latency some call really had.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from sqlalchemy import Connection, Table, select, union

from trm_store.domain._common import check_id, check_int
from trm_store.domain.errors import UnknownLLMSourceError
from trm_store.domain.llm_calls.projection import PROJECTION
from trm_store.domain.llm_calls.tokens import Tokens, add_tokens, no_tokens

if TYPE_CHECKING:
    from collections.abc import Mapping

    from trm_store.store import Store

__all__ = [
    "TRUNCATED",
    "LLMSourceStats",
    "LimitStats",
    "SaltCalls",
    "Spread",
    "llm_sources",
    "llm_stats",
    "percentile",
]

TRUNCATED = "truncated_no_done"
"""The failed-attempt reason of a stream that ended without its `[DONE]`."""


class Spread(TypedDict):
    """How many values, and their nearest-rank median and 95th percentile (None without values)."""

    n: int
    p50: float | None
    p95: float | None


class SaltCalls(TypedDict):
    """The calls asked with one cache salt (the demo tells its two arms apart by salt)."""

    calls: int
    cache_hits: int
    failed: int
    tokens: Tokens


class LimitStats(TypedDict):
    """The concurrency limiter's moves: None figures when it never moved (or there is none)."""

    changes: int
    shrank: int
    """Moves down, each on an overload (too many calls in flight for the endpoint)."""
    current: int | None
    """The limit after the last move."""
    min: int | None
    max: int | None
    path: list[int]
    """The limit before the first move, then after each move."""


class LLMSourceStats(TypedDict):
    """One source's calls and breaker, as `llm_stats` counts them."""

    calls: int
    """Calls that ended: completed + failed."""
    completed: int
    failed: int
    errors: dict[str, int]
    """Failed calls by kind: `retries_exhausted`, `fatal`, `circuit_open`, ..."""
    cache_hits: int
    cache_hit_rate: float | None
    """cache_hits / calls; None without calls."""
    attempts: int
    """Requests sent (a cache hit sends none)."""
    retries: int
    """Requests sent after a call's first."""
    attempt_reasons: dict[str, int]
    """Failed attempts by reason: `truncated_no_done`, `http_500`, `stall_inter_token`, ..."""
    truncated_streams: int
    """Failed attempts whose stream ended without `[DONE]` (caught, never graded or cached)."""
    length_finishes: int
    """Completed calls that stopped at the token limit (finish_reason `length`)."""
    tokens_discarded: int
    """Chunks of failed attempts thrown away."""
    last_error: str | None
    """The last failed call's reason and message, the breaker's bare refusals aside (None if
    no other call failed)."""
    overload_retries: int
    """Attempts cut by an overload that the concurrency limiter handled (retried, not counted
    against the breaker)."""
    tokens: Tokens
    limit: LimitStats
    breaker_opened: int
    """Breaker transitions to `open`."""
    latency_ms: Spread
    ttft_ms: Spread
    by_salt: dict[str | None, SaltCalls]
    """The calls per cache salt (None: asked without one)."""


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank p-th percentile (0 < p <= 100) of `values`; None if there are none."""
    if not 0 < p <= 100:
        raise ValueError(f"p must be in (0, 100], got {p!r}")
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _spread(values: Sequence[float]) -> Spread:
    return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95)}


@dataclass
class _Tally:
    """One source's figures while its rows are read."""

    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    by_salt: dict[str | None, SaltCalls] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tokens: Tokens = field(default_factory=no_tokens)
    limits: list[int] = field(default_factory=list)  # the limit path
    last_error: str | None = None
    shrank: int = 0

    def add(self, row: Any) -> None:
        hit, failed = bool(row.cache_hit), row.outcome == "failed"
        salt = self.by_salt.setdefault(
            row.cache_salt, {"calls": 0, "cache_hits": 0, "failed": 0, "tokens": no_tokens()}
        )
        salt["calls"] += 1
        salt["cache_hits"] += hit
        salt["failed"] += failed
        add_tokens(salt["tokens"], row)
        add_tokens(self.tokens, row)
        self.counts.update(
            calls=1,
            completed=not failed,
            failed=failed,
            cache_hits=hit,
            attempts=row.attempts,
            retries=max(row.attempts - 1, 0),
            tokens_discarded=row.tokens_discarded,
            overload_retries=row.overload_retries,
            length_finishes=row.finish_reason == "length",
        )
        if failed:
            self.errors[row.error] += 1
            if row.error != "circuit_open":
                self.last_error = f"{row.reason}: {row.detail}"
        self.reasons.update(row.attempt_reasons)
        if not failed and not hit:
            self.latencies.append(row.latency_ms)
            if row.ttft_ms is not None:
                self.ttfts.append(row.ttft_ms)

    def limit_changed(self, row: Any) -> None:
        if not self.limits:
            self.limits.append(row.from_limit)
        self.limits.append(row.to_limit)
        self.shrank += row.to_limit < row.from_limit

    def stats(self) -> LLMSourceStats:
        c, path = self.counts, self.limits
        return {
            "calls": c["calls"],
            "completed": c["completed"],
            "failed": c["failed"],
            "errors": dict(self.errors),
            "cache_hits": c["cache_hits"],
            "cache_hit_rate": c["cache_hits"] / c["calls"] if c["calls"] else None,
            "attempts": c["attempts"],
            "retries": c["retries"],
            "attempt_reasons": dict(self.reasons),
            "truncated_streams": self.reasons[TRUNCATED],
            "length_finishes": c["length_finishes"],
            "tokens_discarded": c["tokens_discarded"],
            "overload_retries": c["overload_retries"],
            "last_error": self.last_error,
            "tokens": self.tokens,
            "limit": {
                "changes": max(len(path) - 1, 0),
                "shrank": self.shrank,
                "current": path[-1] if path else None,
                "min": min(path) if path else None,
                "max": max(path) if path else None,
                "path": path,
            },
            "breaker_opened": c["breaker_opened"],
            "latency_ms": _spread(self.latencies),
            "ttft_ms": _spread(self.ttfts),
            "by_salt": self.by_salt,
        }


_CALL_COLUMNS = (
    "source",
    "outcome",
    "error",
    "reason",
    "detail",
    "cache_hit",
    "cache_salt",
    "attempts",
    "attempt_reasons",
    "tokens_discarded",
    "overload_retries",
    "finish_reason",
    "latency_ms",
    "ttft_ms",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
)


def llm_stats(
    store: Store, *, source: str | None = None, after: int = 0
) -> dict[str, LLMSourceStats]:
    """Per source (by name), the figures of its calls and breaker changes whose events sit after
    position `after` (0: all). Without `source`, every source with such events; with it, that
    source alone, all zeros if it has events but none after `after`, and UnknownLLMSourceError
    (naming the known ones) if it has none at all."""
    if source is not None:
        check_id("source", source)
    check_int("after", after, minimum=0)
    tallies: dict[str, _Tally] = {}
    with store.query(PROJECTION) as (conn, tables):
        calls, breaker, limits = tables["calls"], tables["breaker"], tables["limits"]
        rows = select(*(calls.c[name] for name in _CALL_COLUMNS)).where(calls.c.position > after)
        opened = select(breaker.c.source).where(
            breaker.c.to_state == "open", breaker.c.position > after
        )
        moves = select(limits).where(limits.c.position > after)
        if source is not None:
            rows = rows.where(calls.c.source == source)
            opened = opened.where(breaker.c.source == source)
            moves = moves.where(limits.c.source == source)
        for row in conn.execute(rows.order_by(calls.c.position)):
            tallies.setdefault(row.source, _Tally()).add(row)
        for (name,) in conn.execute(opened):
            tallies.setdefault(name, _Tally()).counts["breaker_opened"] += 1
        for row in conn.execute(moves.order_by(limits.c.position)):
            tallies.setdefault(row.source, _Tally()).limit_changed(row)
        if source is not None and source not in tallies:
            known = _sources(conn, tables)
            if source not in known:
                raise UnknownLLMSourceError(
                    f"no LLM calls recorded for source {source!r} "
                    f"(known: {', '.join(sorted(known)) or 'none'})"
                )
            tallies[source] = _Tally()
    return {name: tallies[name].stats() for name in sorted(tallies)}


def llm_sources(store: Store) -> list[str]:
    """Every source with a call or a breaker change recorded, by name (two indexed reads: what
    a listing needs without counting every call)."""
    with store.query(PROJECTION) as (conn, tables):
        return sorted(_sources(conn, tables))


def _sources(conn: Connection, tables: Mapping[str, Table]) -> set[str]:
    """Every source with a call, a breaker change or a limit change recorded."""
    calls, breaker, limits = tables["calls"], tables["breaker"], tables["limits"]
    query = union(select(calls.c.source), select(breaker.c.source), select(limits.c.source))
    return {name for (name,) in conn.execute(query)}
