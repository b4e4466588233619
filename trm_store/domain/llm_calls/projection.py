"""The `llm_calls` projection: the read models of the LLM calls' events.

- `llm_calls`: one row per call: outcome, cache status and salt, attempts and the reasons of
  the failed ones, latency, TTFT, tokens, the event's position;
- `llm_breaker_transitions`: every breaker state change, per source, in order;
- `llm_limit_changes`: every move of the concurrency limit, per source, in order;
- `llm_cache_problems`: every corrupt entry and failed cache read or write (source `cache`);
- `llm_call_totals` and `llm_call_counts`: the calls' running totals per source and salt, and
  the failed calls and attempts per error kind and reason (`totals`: what `llm_stats` reads
  instead of every call).

Besides the source index, `llm_calls` has two on (source, outcome, cache_hit, then latency_ms or
ttft_ms, position): a nearest-rank percentile of a source's fetched calls is one `ORDER BY ...
LIMIT 1 OFFSET k` walking one index (position in it: no table read for an `after`); and one on
(source, outcome, position), to find a source's last failed call without reading the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    insert,
    select,
)

from trm_store.domain._common import present, upsert
from trm_store.domain.llm_calls.models import (
    BREAKER_CHANGED,
    CACHE_CORRUPT,
    CACHE_EVENTS,
    CALL_COMPLETED,
    CALL_FAILED,
    LIMIT_CHANGED,
    STREAM,
)
from trm_store.domain.llm_calls.totals import define_totals, update_totals
from trm_store.events import RecordedEvent
from trm_store.projections import Projection, register_projection
from trm_store.schema import JsonColumn
from trm_store.vocabulary import INT64_MIN, count_problem

__all__ = ["PROJECTION", "LLMCallsProjection"]

PROJECTION = "llm_calls"


class LLMCallsProjection(Projection):
    """`llm_calls`, `llm_breaker_transitions`, `llm_limit_changes` and `llm_cache_problems`
    (see the module doc)."""

    name: ClassVar[str] = PROJECTION
    version: ClassVar[int] = 5  # 3: exact JSON text (issue 14); 4: overload_retries (17);
    # 5: running totals per source and salt, and the percentile indexes (issue 18)
    event_types: ClassVar[frozenset[str]] = frozenset(
        {CALL_COMPLETED, CALL_FAILED, BREAKER_CHANGED, LIMIT_CHANGED} | CACHE_EVENTS
    )

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        calls = Table(
            f"llm_calls{suffix}",
            metadata,
            Column("call_id", String(255), primary_key=True),
            Column("source", String(255), nullable=False),
            Column("parent_call_id", String(255), nullable=True),
            Column("model", String(255), nullable=False),
            Column("endpoint", Text, nullable=False),
            Column("profile", String(255), nullable=False),
            Column("outcome", String(16), nullable=False),  # completed | failed
            Column("error", String(32), nullable=True),  # the failure kind, if failed
            Column("reason", String(255), nullable=True),  # the last failure reason, if failed
            Column("detail", Text, nullable=True),  # the failure's message, if failed
            Column("status", Integer, nullable=True),
            Column("finish_reason", String(255), nullable=True),
            Column("cache", String(8), nullable=False),  # off | hit | miss
            Column("cache_hit", Boolean, nullable=False),
            Column("cache_write", String(16), nullable=True),
            Column("cache_salt", Text, nullable=True),
            Column("attempts", Integer, nullable=False),
            Column("attempt_reasons", JsonColumn, nullable=False),  # failed attempts, in order
            Column("tokens_discarded", BigInteger, nullable=False),
            Column("overload_retries", Integer, nullable=False),  # handled by the limiter
            Column("latency_ms", Float, nullable=False),
            Column("ttft_ms", Float, nullable=True),
            Column("max_inter_token_ms", Float, nullable=True),
            Column("prompt_tokens", BigInteger, nullable=True),
            Column("completion_tokens", BigInteger, nullable=True),
            Column("total_tokens", BigInteger, nullable=True),
            Column("position", BigInteger, nullable=False),
            Column("recorded_at", DateTime(timezone=True), nullable=False),
        )
        Index(f"ix_llm_calls_source{suffix}", calls.c.source, calls.c.position)
        fetched = (calls.c.source, calls.c.outcome, calls.c.cache_hit)
        Index(f"ix_llm_calls_latency{suffix}", *fetched, calls.c.latency_ms, calls.c.position)
        Index(f"ix_llm_calls_ttft{suffix}", *fetched, calls.c.ttft_ms, calls.c.position)
        Index(f"ix_llm_calls_outcome{suffix}", calls.c.source, calls.c.outcome, calls.c.position)
        breaker = Table(
            f"llm_breaker_transitions{suffix}",
            metadata,
            Column("position", BigInteger, primary_key=True, autoincrement=False),
            Column("source", String(255), nullable=False),
            Column("from_state", String(16), nullable=False),
            Column("to_state", String(16), nullable=False),
            Column("failures", BigInteger, nullable=False),
            Column("at", Float, nullable=True),
            Column("call_id", String(255), nullable=True),
            Column("recorded_at", DateTime(timezone=True), nullable=False),
        )
        Index(f"ix_llm_breaker_source{suffix}", breaker.c.source, breaker.c.position)
        limits = Table(
            f"llm_limit_changes{suffix}",
            metadata,
            Column("position", BigInteger, primary_key=True, autoincrement=False),
            Column("source", String(255), nullable=False),
            Column("from_limit", Integer, nullable=False),
            Column("to_limit", Integer, nullable=False),
            Column("cause", String(16), nullable=False),
            Column("reason", String(255), nullable=True),
            Column("in_flight", Integer, nullable=False),
            Column("ceiling", Integer, nullable=False),
            Column("call_id", String(255), nullable=False),
            Column("recorded_at", DateTime(timezone=True), nullable=False),
        )
        Index(f"ix_llm_limit_source{suffix}", limits.c.source, limits.c.position)
        cache = Table(
            f"llm_cache_problems{suffix}",
            metadata,
            Column("position", BigInteger, primary_key=True, autoincrement=False),
            Column("kind", String(32), nullable=False),
            Column("backend", String(32), nullable=False),
            Column("namespace", String(255), nullable=False),
            Column("key", String(64), nullable=False),
            Column("cause", String(255), nullable=False),  # corrupt: reason; failed: error class
            Column("detail", Text, nullable=False),
            Column("recorded_at", DateTime(timezone=True), nullable=False),
        )
        return {
            "calls": calls,
            "breaker": breaker,
            "limits": limits,
            "cache": cache,
            **define_totals(metadata, suffix),
        }

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        calls: list[dict[str, Any]] = []
        breaker: list[dict[str, Any]] = []
        limits: list[dict[str, Any]] = []
        cache: list[dict[str, Any]] = []
        for event in events:
            if event.type in (CALL_COMPLETED, CALL_FAILED):
                calls.append(_call_row(event))
            elif event.type == BREAKER_CHANGED:
                breaker.append(_breaker_row(event))
            elif event.type == LIMIT_CHANGED:
                limits.append(_limit_row(event))
            else:
                cache.append(_cache_row(event))
        calls = list({row["call_id"]: row for row in calls}.values())  # the last one counts
        update_totals(conn, tables, _recorded(conn, tables["calls"], calls), calls)
        columns = [c.name for c in tables["calls"].columns if c.name != "call_id"]
        upsert(conn, tables["calls"], calls, keys=("call_id",), update=columns)
        for name, rows in (("breaker", breaker), ("limits", limits), ("cache", cache)):
            if rows:
                conn.execute(insert(tables[name]), rows)


_CHUNK = 512  # call ids per IN (...) query


def _recorded(conn: Connection, table: Table, calls: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The rows already recorded for these calls' ids (a call recorded again), as mappings.

    Almost every call is new, so the ids are first looked up alone on the driver (`present`):
    only the few found are read through SQLAlchemy, whose result types (JSON, booleans) the
    totals need.
    """
    ids = [row["call_id"] for row in calls]
    seen = present(conn, table, "call_id", ids)
    found: list[Any] = []
    for k in range(0, len(seen), _CHUNK):
        query = select(table).where(table.c.call_id.in_(seen[k : k + _CHUNK]))
        found += [row._mapping for row in conn.execute(query)]
    return found


def _source(event: RecordedEvent) -> str:
    return event.stream_id.removeprefix(f"{STREAM}:")


def _usage_int(usage: Any, name: str) -> int | None:
    """A token count of the provider's free-form `usage`, or None where it holds none: not an
    int, or one no BIGINT column holds (the log keeps the usage as it came)."""
    value = usage.get(name) if isinstance(usage, dict) else None
    return value if count_problem(value, INT64_MIN) is None else None


def _call_row(event: RecordedEvent) -> dict[str, Any]:
    data = event.data
    completed = event.type == CALL_COMPLETED
    attempts = data["attempts"]
    usage = data.get("usage")
    return {
        "call_id": data["call_id"],
        "source": _source(event),
        "parent_call_id": data["parent_call_id"],
        "model": data["model"],
        "endpoint": data["endpoint"],
        "profile": data["profile"],
        "outcome": "completed" if completed else "failed",
        "error": None if completed else data["error"],
        "reason": None if completed else data["reason"],
        "detail": None if completed else data["detail"],
        "status": attempts[-1]["status"] if completed and attempts else data.get("status"),
        "finish_reason": data["finish_reason"] if completed else None,
        "cache": data["cache"],
        "cache_hit": data["cache"] == "hit",
        "cache_write": data.get("cache_write"),
        "cache_salt": data["cache_salt"],
        "attempts": len(attempts),
        "attempt_reasons": [a["reason"] for a in attempts if a["outcome"] != "ok"],
        "tokens_discarded": sum(a["tokens_discarded"] for a in attempts),
        "overload_retries": sum(bool(a.get("overload")) for a in attempts),
        "latency_ms": data["latency_ms"],
        "ttft_ms": data.get("ttft_ms"),
        "max_inter_token_ms": data.get("max_inter_token_ms"),
        "prompt_tokens": _usage_int(usage, "prompt_tokens"),
        "completion_tokens": _usage_int(usage, "completion_tokens"),
        "total_tokens": _usage_int(usage, "total_tokens"),
        "position": event.position,
        "recorded_at": event.recorded_at,
    }


def _breaker_row(event: RecordedEvent) -> dict[str, Any]:
    return {
        "position": event.position,
        "source": _source(event),
        **{k: event.data[k] for k in ("from_state", "to_state", "failures", "at", "call_id")},
        "recorded_at": event.recorded_at,
    }


def _limit_row(event: RecordedEvent) -> dict[str, Any]:
    keys = ("from_limit", "to_limit", "cause", "reason", "in_flight", "ceiling", "call_id")
    return {
        "position": event.position,
        "source": _source(event),
        **{k: event.data[k] for k in keys},
        "recorded_at": event.recorded_at,
    }


def _cache_row(event: RecordedEvent) -> dict[str, Any]:
    data = event.data
    return {
        "position": event.position,
        "kind": event.type.removeprefix("llm."),
        "backend": data["backend"],
        "namespace": data["namespace"],
        "key": data["key"],
        "cause": data["reason"] if event.type == CACHE_CORRUPT else data["error"],
        "detail": data["detail"],
        "recorded_at": event.recorded_at,
    }


register_projection(LLMCallsProjection())
