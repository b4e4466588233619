"""The LLM calls' event models: what `trm_llm.StoreEventSink` appends on `llm:{source}`.

`GovernedLLMClient` and the response caches emit these payloads (the models below are their
one drawing); each has a strict model here, so a payload that drifts from it (or carries
anything extra, such as a header) is refused before it is written. The type names are the ones
the sink appends, unprefixed.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue

from trm_store.domain._common import Count, DomainModel, Real, stream_id
from trm_store.events import register_event_type

__all__ = [
    "BREAKER_CHANGED",
    "BREAKER_DEGRADED",
    "BREAKER_RESTORED",
    "CACHE_CORRUPT",
    "CACHE_EVENTS",
    "CACHE_READ_FAILED",
    "CACHE_WRITE_FAILED",
    "CALL_COMPLETED",
    "CALL_FAILED",
    "LIMIT_CHANGED",
    "STREAM",
    "llm_stream",
]

STREAM = "llm"

_Short = Annotated[str, Field(min_length=1, max_length=255)]
_Ms = Annotated[Real, Field(ge=0)]
_TOKENS_MAX = 2**40 - 1
_ATTEMPTS_MAX = 2**23
"""The most tokens one attempt may discard, and the most attempts a call records: far beyond any
real call, and small enough that a call's total (the projection's sum) fits a BIGINT column."""
_State = Literal["closed", "open", "half_open"]


class Attempt(DomainModel):
    n: int = Field(ge=1)
    outcome: Literal["ok", "retry", "failed"]
    reason: str | None = Field(max_length=255)
    status: int | None = Field(ge=100, le=599)
    latency_ms: _Ms
    tokens_discarded: int = Field(ge=0, le=_TOKENS_MAX)
    sleep_s: Real | None = Field(ge=0)
    overload: bool = False  # an overload the concurrency limiter handled (absent before it)


class _Call(DomainModel):
    call_id: _Short
    parent_call_id: _Short | None
    model: _Short
    endpoint: str = Field(max_length=2000)
    profile: _Short
    cache_salt: str | None = Field(max_length=1000)
    latency_ms: _Ms
    attempts: list[Attempt] = Field(max_length=_ATTEMPTS_MAX)
    sanitised: list[Annotated[str, Field(max_length=255)]] = Field(default=[], max_length=32)


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
    failures: Count
    at: Real | None
    call_id: _Short | None


class LimitChanged(DomainModel):
    """The concurrency limiter moved its limit: shrank on an overload, grew on successes."""

    from_limit: int = Field(ge=1)
    to_limit: int = Field(ge=1)
    cause: Literal["overload", "success"]
    reason: _Short | None  # the overload signal ("RemoteProtocolError", "http_503", ...)
    in_flight: int = Field(ge=0)
    ceiling: int = Field(ge=1)
    call_id: _Short


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
LIMIT_CHANGED = "llm.limit_changed"
BREAKER_DEGRADED = "llm.breaker_degraded"
BREAKER_RESTORED = "llm.breaker_restored"
CACHE_CORRUPT = "llm.cache_corrupt"
CACHE_READ_FAILED = "llm.cache_read_failed"
CACHE_WRITE_FAILED = "llm.cache_write_failed"
register_event_type(CALL_COMPLETED, CallCompleted)
register_event_type(CALL_FAILED, CallFailed)
register_event_type(BREAKER_CHANGED, BreakerChanged)
register_event_type(LIMIT_CHANGED, LimitChanged)
register_event_type(BREAKER_DEGRADED, BreakerSharedState)
register_event_type(BREAKER_RESTORED, BreakerSharedState)
register_event_type(CACHE_CORRUPT, CacheCorrupt)
register_event_type(CACHE_READ_FAILED, CacheIOFailed)
register_event_type(CACHE_WRITE_FAILED, CacheIOFailed)
CACHE_EVENTS = frozenset({CACHE_CORRUPT, CACHE_READ_FAILED, CACHE_WRITE_FAILED})


def llm_stream(source: str) -> str:
    """The stream of one LLM source (`llm:cache` holds the caches' events)."""
    return stream_id(STREAM, source)
