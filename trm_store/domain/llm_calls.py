"""LLM calls (seed tasks 1-5): the governed client's events on `llm:{source}` and their read models.

`trm_llm.StoreEventSink` appends what `GovernedLLMClient` and the response caches emit; the
payloads are drawn in the docstring of `trm_llm/sink.py` and each has a strict model here, so a
payload that drifts from it (or carries anything extra, such as a header) is refused before it
is written. The type names are the ones the sink appends, unprefixed. Read models (projection
`llm_calls`):

- `llm_calls`: one row per call: outcome, cache status and salt, attempts and the reasons of
  the failed ones, latency, TTFT, tokens, the event's position;
- `llm_breaker_transitions`: every breaker state change, per source, in order;
- `llm_cache_problems`: every corrupt entry and failed cache read or write (source `cache`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, JsonValue
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

from trm_store.domain._common import DomainModel, as_utc, check_id, stream_id, upsert
from trm_store.domain.errors import UnknownEntityError
from trm_store.events import RecordedEvent, register_event_type
from trm_store.projections import Projection, register_projection
from trm_store.schema import JsonColumn

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = [
    "BREAKER_CHANGED",
    "BREAKER_DEGRADED",
    "BREAKER_RESTORED",
    "CACHE_CORRUPT",
    "CACHE_READ_FAILED",
    "CACHE_WRITE_FAILED",
    "CALL_COMPLETED",
    "CALL_FAILED",
    "UnknownCallError",
    "breaker_transitions",
    "cache_problems",
    "llm_call",
    "llm_calls",
    "llm_stats",
    "llm_stream",
]

STREAM = "llm"
PROJECTION = "llm_calls"

_Short = Annotated[str, Field(min_length=1, max_length=255)]
_Ms = Annotated[float, Field(ge=0)]
_State = Literal["closed", "open", "half_open"]


class UnknownCallError(UnknownEntityError):
    """No call with this id was recorded."""


class Attempt(DomainModel):
    n: int = Field(ge=1)
    outcome: Literal["ok", "retry", "failed"]
    reason: str | None = Field(max_length=255)
    status: int | None = Field(ge=100, le=599)
    latency_ms: _Ms
    tokens_discarded: int = Field(ge=0)
    sleep_s: float | None = Field(ge=0)


class _Call(DomainModel):
    call_id: _Short
    parent_call_id: _Short | None
    model: _Short
    endpoint: str = Field(max_length=2000)
    profile: _Short
    cache_salt: str | None = Field(max_length=1000)
    latency_ms: _Ms
    attempts: list[Attempt]


class CallCompleted(_Call):
    cache: Literal["off", "hit", "miss"]
    cache_write: Literal["written", "failed", "skipped"] | None
    finish_reason: _Short
    usage: dict[str, JsonValue] | None
    ttft_ms: _Ms | None
    max_inter_token_ms: _Ms | None


class CallFailed(_Call):
    cache: Literal["off", "miss"]
    error: Literal["retries_exhausted", "fatal", "circuit_open", "cancelled", "unexpected"]
    reason: _Short
    status: int | None = Field(ge=100, le=599)
    detail: str = Field(max_length=1000)


class BreakerChanged(DomainModel):
    from_state: _State
    to_state: _State
    failures: int = Field(ge=0)
    at: float | None
    call_id: _Short | None


class BreakerSharedState(DomainModel):
    """The Redis-shared breaker lost (`breaker_degraded`) or regained (`breaker_restored`) Redis."""

    backend: Literal["redis"]
    namespace: _Short
    detail: str = Field(max_length=1000)


class _CacheProblem(DomainModel):
    backend: str = Field(min_length=1, max_length=32)
    namespace: _Short
    key: str = Field(pattern=r"^[0-9a-f]{64}$")
    detail: str = Field(max_length=1000)


class CacheCorrupt(_CacheProblem):
    reason: Literal["bad_json", "wrong_shape", "wrong_version"]


class CacheIOFailed(_CacheProblem):
    error: _Short


CALL_COMPLETED = "llm.call_completed"
CALL_FAILED = "llm.call_failed"
BREAKER_CHANGED = "llm.breaker_changed"
BREAKER_DEGRADED = "llm.breaker_degraded"
BREAKER_RESTORED = "llm.breaker_restored"
CACHE_CORRUPT = "llm.cache_corrupt"
CACHE_READ_FAILED = "llm.cache_read_failed"
CACHE_WRITE_FAILED = "llm.cache_write_failed"
register_event_type(CALL_COMPLETED, CallCompleted)
register_event_type(CALL_FAILED, CallFailed)
register_event_type(BREAKER_CHANGED, BreakerChanged)
register_event_type(BREAKER_DEGRADED, BreakerSharedState)
register_event_type(BREAKER_RESTORED, BreakerSharedState)
register_event_type(CACHE_CORRUPT, CacheCorrupt)
register_event_type(CACHE_READ_FAILED, CacheIOFailed)
register_event_type(CACHE_WRITE_FAILED, CacheIOFailed)
_CACHE_EVENTS = frozenset({CACHE_CORRUPT, CACHE_READ_FAILED, CACHE_WRITE_FAILED})


def llm_stream(source: str) -> str:
    """The stream of one LLM source (`llm:cache` holds the caches' events)."""
    return stream_id(STREAM, source)


class LLMCallsProjection(Projection):
    """`llm_calls`, `llm_breaker_transitions` and `llm_cache_problems` (see the module doc)."""

    name: ClassVar[str] = PROJECTION
    version: ClassVar[int] = 2
    event_types: ClassVar[frozenset[str]] = frozenset(
        {CALL_COMPLETED, CALL_FAILED, BREAKER_CHANGED} | _CACHE_EVENTS
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
            Column("status", Integer, nullable=True),
            Column("finish_reason", String(255), nullable=True),
            Column("cache", String(8), nullable=False),  # off | hit | miss
            Column("cache_hit", Boolean, nullable=False),
            Column("cache_write", String(16), nullable=True),
            Column("cache_salt", Text, nullable=True),
            Column("attempts", Integer, nullable=False),
            Column("attempt_reasons", JsonColumn, nullable=False),  # failed attempts, in order
            Column("tokens_discarded", Integer, nullable=False),
            Column("latency_ms", Float, nullable=False),
            Column("ttft_ms", Float, nullable=True),
            Column("max_inter_token_ms", Float, nullable=True),
            Column("prompt_tokens", Integer, nullable=True),
            Column("completion_tokens", Integer, nullable=True),
            Column("total_tokens", Integer, nullable=True),
            Column("position", BigInteger, nullable=False),
            Column("recorded_at", DateTime(timezone=True), nullable=False),
        )
        Index(f"ix_llm_calls_source{suffix}", calls.c.source, calls.c.position)
        breaker = Table(
            f"llm_breaker_transitions{suffix}",
            metadata,
            Column("position", BigInteger, primary_key=True, autoincrement=False),
            Column("source", String(255), nullable=False),
            Column("from_state", String(16), nullable=False),
            Column("to_state", String(16), nullable=False),
            Column("failures", Integer, nullable=False),
            Column("at", Float, nullable=True),
            Column("call_id", String(255), nullable=True),
            Column("recorded_at", DateTime(timezone=True), nullable=False),
        )
        Index(f"ix_llm_breaker_source{suffix}", breaker.c.source, breaker.c.position)
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
        return {"calls": calls, "breaker": breaker, "cache": cache}

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        calls: list[dict[str, Any]] = []
        breaker: list[dict[str, Any]] = []
        cache: list[dict[str, Any]] = []
        for event in events:
            if event.type in (CALL_COMPLETED, CALL_FAILED):
                calls.append(_call_row(event))
            elif event.type == BREAKER_CHANGED:
                breaker.append(_breaker_row(event))
            else:
                cache.append(_cache_row(event))
        columns = [c.name for c in tables["calls"].columns if c.name != "call_id"]
        upsert(conn, tables["calls"], calls, keys=("call_id",), update=columns)
        for table, rows in ((tables["breaker"], breaker), (tables["cache"], cache)):
            if rows:
                conn.execute(insert(table), rows)


def _source(event: RecordedEvent) -> str:
    return event.stream_id.removeprefix(f"{STREAM}:")


def _usage_int(usage: Any, name: str) -> int | None:
    value = usage.get(name) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
        "status": attempts[-1]["status"] if completed and attempts else data.get("status"),
        "finish_reason": data["finish_reason"] if completed else None,
        "cache": data["cache"],
        "cache_hit": data["cache"] == "hit",
        "cache_write": data.get("cache_write"),
        "cache_salt": data["cache_salt"],
        "attempts": len(attempts),
        "attempt_reasons": [a["reason"] for a in attempts if a["outcome"] != "ok"],
        "tokens_discarded": sum(a["tokens_discarded"] for a in attempts),
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


def _rows(store: Store, table: str, source: str | None) -> list[dict[str, Any]]:
    with store.query(PROJECTION) as (conn, tables):
        t = tables[table]
        query = select(t).order_by(t.c.position)
        if source is not None:
            query = query.where(t.c.source == check_id("source", source))
        rows = [dict(r._mapping) for r in conn.execute(query)]
    for row in rows:
        row["recorded_at"] = as_utc(row["recorded_at"])
    return rows


def llm_calls(store: Store, *, source: str | None = None) -> list[dict[str, Any]]:
    """Every recorded call (of one source, if given) in the order they ended."""
    return _rows(store, "calls", source)


def llm_call(store: Store, call_id: str) -> dict[str, Any]:
    """One call's row; `UnknownCallError` if it was never recorded."""
    check_id("call_id", call_id)
    with store.query(PROJECTION) as (conn, tables):
        calls = tables["calls"]
        row = conn.execute(select(calls).where(calls.c.call_id == call_id)).first()
    if row is None:
        raise UnknownCallError(f"no LLM call {call_id!r} was recorded")
    return {**row._mapping, "recorded_at": as_utc(row.recorded_at)}


def breaker_transitions(store: Store, *, source: str | None = None) -> list[dict[str, Any]]:
    """Breaker state changes (of one source, if given) in order."""
    return _rows(store, "breaker", source)


def cache_problems(store: Store) -> list[dict[str, Any]]:
    """Corrupt cache entries and failed cache reads and writes, in order."""
    return _rows(store, "cache", None)


def llm_stats(store: Store) -> dict[str, dict[str, Any]]:
    """Per source: calls, completed, failed, cache hits, attempts, retries, failures by error,
    failed attempts by reason (e.g. `truncated_no_done`), breaker transitions to open."""
    stats: dict[str, dict[str, Any]] = {}
    with store.query(PROJECTION) as (conn, tables):
        calls, breaker = tables["calls"], tables["breaker"]
        query = select(
            calls.c.source,
            calls.c.outcome,
            calls.c.error,
            calls.c.cache_hit,
            calls.c.attempts,
            calls.c.attempt_reasons,
        )
        for row in conn.execute(query):
            entry = stats.setdefault(row.source, _empty_stats())
            entry["calls"] += 1
            entry[row.outcome] += 1
            entry["cache_hits"] += int(row.cache_hit)
            entry["attempts"] += row.attempts
            entry["retries"] += max(row.attempts - 1, 0)
            if row.error is not None:
                entry["errors"][row.error] += 1
            entry["attempt_reasons"].update(row.attempt_reasons)
        opened = select(breaker.c.source).where(breaker.c.to_state == "open")
        for (source,) in conn.execute(opened):
            stats.setdefault(source, _empty_stats())["breaker_opened"] += 1
    for entry in stats.values():
        entry["errors"] = dict(entry["errors"])
        entry["attempt_reasons"] = dict(entry["attempt_reasons"])
    return stats


def _empty_stats() -> dict[str, Any]:
    return {
        "calls": 0,
        "completed": 0,
        "failed": 0,
        "cache_hits": 0,
        "attempts": 0,
        "retries": 0,
        "errors": Counter(),
        "attempt_reasons": Counter(),
        "breaker_opened": 0,
    }
