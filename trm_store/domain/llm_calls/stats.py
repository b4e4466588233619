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

from sqlalchemy import Connection, Table, false, func, select, union

from trm_store.domain._common import check_id, check_int
from trm_store.domain.errors import UnknownLLMSourceError
from trm_store.domain.llm_calls.projection import PROJECTION
from trm_store.domain.llm_calls.tokens import Tokens
from trm_store.domain.llm_calls.totals import (
    BOUNDS,
    COUNTERS,
    ERROR,
    LATENCY,
    REASON,
    TTFT,
    call_counts,
    call_names,
    key_name,
)

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
    "rank",
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


def rank(p: float, n: int) -> int:
    """The 0-based index of the nearest-rank p-th percentile (0 < p <= 100) among n > 0 sorted
    values."""
    return max(0, math.ceil(p / 100 * n) - 1)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank p-th percentile (0 < p <= 100) of `values`; None if there are none."""
    if not 0 < p <= 100:
        raise ValueError(f"p must be in (0, 100], got {p!r}")
    if not values:
        return None
    return sorted(values)[rank(p, len(values))]


def llm_stats(
    store: Store, *, source: str | None = None, after: int = 0
) -> dict[str, LLMSourceStats]:
    """Per source (by name), the figures of its calls and breaker changes whose events sit after
    position `after` (0: all). Without `source`, every source with such events; with it, that
    source alone, all zeros if it has events but none after `after`, and UnknownLLMSourceError
    (naming the known ones) if it has none at all.

    Its cost does not grow with the calls recorded: over all of them (`after` 0, as the web view
    asks) the counts are the projection's running totals, a few rows per source; after a
    position (a job's own calls: the demo, `trm diagnose`) the rows after it are added up the
    same way (`call_counts`). Percentiles and the last error are indexed reads either way."""
    if source is not None:
        check_id("source", source)
    check_int("after", after, minimum=0)
    with store.query(PROJECTION) as (conn, tables):
        tallies = (
            _totals(conn, tables, source) if after == 0 else _since(conn, tables, source, after)
        )
        _breaker_and_limits(conn, tables, tallies, source, after)
        if source is not None and source not in tallies:
            known = _sources(conn, tables)
            if source not in known:
                raise UnknownLLMSourceError(
                    f"no LLM calls recorded for source {source!r} "
                    f"(known: {', '.join(sorted(known)) or 'none'})"
                )
            tallies[source] = _Tally()
        return {name: tallies[name].stats(conn, tables, name, after) for name in sorted(tallies)}


def llm_sources(store: Store) -> list[str]:
    """Every source with a call or a breaker change recorded, by name (indexed reads of the
    totals, breaker and limit tables: what a listing needs without counting every call)."""
    with store.query(PROJECTION) as (conn, tables):
        return sorted(_sources(conn, tables))


def _sources(conn: Connection, tables: Mapping[str, Table]) -> set[str]:
    """Every source with a call, a breaker change or a limit change recorded."""
    totals, breaker, limits = tables["totals"], tables["breaker"], tables["limits"]
    query = union(select(totals.c.source), select(breaker.c.source), select(limits.c.source))
    return {name for (name,) in conn.execute(query)}


def _salt_calls(counts: Mapping[str, int]) -> SaltCalls:
    return {
        "calls": counts["calls"],
        "cache_hits": counts["cache_hits"],
        "failed": counts["failed"],
        "tokens": {
            "calls": counts["token_calls"],
            "prompt": counts["prompt_tokens"],
            "completion": counts["completion_tokens"],
            "total": counts["total_tokens"],
        },
    }


@dataclass
class _Tally:
    """One source's figures while they are read: `counts` holds `COUNTERS` and
    `breaker_opened`."""

    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str | None] = field(default_factory=Counter)
    by_salt: dict[str | None, Counter[str]] = field(default_factory=dict)
    buckets: dict[str, Counter[int]] = field(
        default_factory=lambda: {LATENCY: Counter(), TTFT: Counter()}
    )
    """The fetched calls per latency and TTFT bucket (`totals.BOUNDS`)."""
    limits: list[int] = field(default_factory=list)  # the limit path
    shrank: int = 0

    def add(self, salt: str | None, counts: Mapping[str, int]) -> None:
        """Add one call's (or one salt's summed) `COUNTERS`."""
        self.counts.update(counts)
        self.by_salt.setdefault(salt, Counter()).update(counts)

    def name(self, kind: str, name: str | None, n: int) -> None:
        """Add `n` to one of `llm_call_counts`' kinds."""
        if kind == ERROR:
            self.errors[str(name)] += n
        elif kind == REASON:
            self.reasons[name] += n
        else:
            self.buckets[kind][int(str(name))] += n

    def limit_changed(self, row: Any) -> None:
        if not self.limits:
            self.limits.append(row.from_limit)
        self.limits.append(row.to_limit)
        self.shrank += row.to_limit < row.from_limit

    def stats(
        self, conn: Connection, tables: Mapping[str, Table], source: str, after: int
    ) -> LLMSourceStats:
        """The figures, with the percentiles and the last error read from the indexes."""
        c, path = self.counts, self.limits
        calls = tables["calls"]
        return {
            "calls": c["calls"],
            "completed": c["completed"],
            "failed": c["failed"],
            "errors": dict(self.errors),
            "cache_hits": c["cache_hits"],
            "cache_hit_rate": c["cache_hits"] / c["calls"] if c["calls"] else None,
            "attempts": c["attempts"],
            "retries": c["retries"],
            "attempt_reasons": dict(self.reasons),  # type: ignore[arg-type]
            "truncated_streams": self.reasons[TRUNCATED],
            "length_finishes": c["length_finishes"],
            "tokens_discarded": c["tokens_discarded"],
            "overload_retries": c["overload_retries"],
            "last_error": _last_error(conn, calls, source, after) if c["failed"] else None,
            "tokens": _salt_calls(c)["tokens"],
            "limit": {
                "changes": max(len(path) - 1, 0),
                "shrank": self.shrank,
                "current": path[-1] if path else None,
                "min": min(path) if path else None,
                "max": max(path) if path else None,
                "path": path,
            },
            "breaker_opened": c["breaker_opened"],
            "latency_ms": _spread(conn, calls.c.latency_ms, source, after, self.buckets[LATENCY]),
            "ttft_ms": _spread(conn, calls.c.ttft_ms, source, after, self.buckets[TTFT]),
            "by_salt": {salt: _salt_calls(n) for salt, n in self.by_salt.items()},
        }


def _fetched(column: Any, source: str, after: int) -> Any:
    """The calls whose `column` counts (completed, not cache hits, with a value), as one range
    of the (source, outcome, cache_hit, column, position) index."""
    calls = column.table
    query = select(column).where(
        calls.c.source == source,
        calls.c.outcome == "completed",
        calls.c.cache_hit == false(),
        column.is_not(None),
    )
    return query.where(calls.c.position > after) if after else query


def _spread(
    conn: Connection, column: Any, source: str, after: int, buckets: Mapping[int, int]
) -> Spread:
    """The nearest-rank median and 95th percentile of `column` over the fetched calls, counted
    per bucket in `buckets`: each is one walk of the column's index inside the bucket that holds
    it, from the bucket's nearer end (`LIMIT 1 OFFSET k`, exact on both backends)."""
    n = sum(buckets.values())

    def at(p: float) -> float | None:
        if not n:
            return None
        k, below = rank(p, n), 0
        for b in sorted(buckets):
            if k < below + buckets[b]:
                break
            below += buckets[b]
        query, k = _fetched(column, source, after), k - below
        if k < buckets[b] // 2:
            query = query.order_by(column).offset(k)
            low = query.where(column >= BOUNDS[b - 1]) if b else query
        else:
            query = query.order_by(column.desc()).offset(buckets[b] - 1 - k)
            low = query.where(column < BOUNDS[b]) if b < len(BOUNDS) else query
        return float(conn.execute(low.limit(1)).scalar_one())

    return {"n": n, "p50": at(50), "p95": at(95)}


def _last_error(conn: Connection, calls: Table, source: str, after: int) -> str | None:
    """The last failed call's reason and message, the breaker's bare refusals aside: the
    newest rows of the (source, outcome, position) index."""
    query = select(calls.c.reason, calls.c.detail).where(
        calls.c.source == source,
        calls.c.outcome == "failed",
        calls.c.error != "circuit_open",
        calls.c.position > after,
    )
    row = conn.execute(query.order_by(calls.c.position.desc()).limit(1)).first()
    return None if row is None else f"{row.reason}: {row.detail}"


def _totals(conn: Connection, tables: Mapping[str, Table], source: str | None) -> dict[str, _Tally]:
    """Every call's figures, from the projection's running totals."""
    totals, counts = tables["totals"], tables["counts"]
    tallies: dict[str, _Tally] = {}
    rows, names = select(totals), select(counts)
    if source is not None:
        rows, names = rows.where(totals.c.source == source), names.where(counts.c.source == source)
    for row in conn.execute(rows.order_by(totals.c.source, totals.c.salt_key)):
        sums = {name: row._mapping[name] for name in COUNTERS}
        tallies.setdefault(row.source, _Tally()).add(row.cache_salt, sums)
    for row in conn.execute(names.order_by(counts.c.source, counts.c.kind, counts.c.name_key)):
        tallies.setdefault(row.source, _Tally()).name(row.kind, key_name(row.name_key), row.n)
    return tallies


def _since(
    conn: Connection, tables: Mapping[str, Table], source: str | None, after: int
) -> dict[str, _Tally]:
    """The figures of the calls after position `after`, added up row by row as the projection
    adds them (a range of the position index: a job's own calls, not the store's)."""
    calls = tables["calls"]
    tallies: dict[str, _Tally] = {}
    rows = select(*(calls.c[name] for name in _CALL_COLUMNS)).where(calls.c.position > after)
    if source is not None:
        rows = rows.where(calls.c.source == source)
    for row in conn.execute(rows.order_by(calls.c.position)):
        tally = tallies.setdefault(row.source, _Tally())
        tally.add(row.cache_salt, call_counts(row._mapping))
        for (kind, name), n in call_names(row._mapping).items():
            tally.name(kind, name, n)
    return tallies


_CALL_COLUMNS = (
    "source",
    "outcome",
    "error",
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


def _breaker_and_limits(
    conn: Connection,
    tables: Mapping[str, Table],
    tallies: dict[str, _Tally],
    source: str | None,
    after: int,
) -> None:
    """Add the breaker's openings (counted in SQL) and the limiter's moves (its path, in order)
    after `after` to `tallies`."""
    breaker, limits = tables["breaker"], tables["limits"]
    opened = (
        select(breaker.c.source, func.count())
        .where(breaker.c.to_state == "open", breaker.c.position > after)
        .group_by(breaker.c.source)
    )
    moves = select(limits).where(limits.c.position > after)
    if source is not None:
        opened = opened.where(breaker.c.source == source)
        moves = moves.where(limits.c.source == source)
    for name, n in conn.execute(opened):
        tallies.setdefault(name, _Tally()).counts["breaker_opened"] += n
    for row in conn.execute(moves.order_by(limits.c.position)):
        tallies.setdefault(row.source, _Tally()).limit_changed(row)
