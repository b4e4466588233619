"""`StoreEventSink`: the governed client's events, appended to the trm_store event log.

Each event goes to stream `llm:{source}` (source = the client's `source`, by default its model
name; cache events use source "cache"). The payloads, exactly as the client emits them
(`trm_store.domain.llm_calls` registers a model for each):

call_completed
    call_id: str                  uuid4 hex, the same as ChatResult.call_id
    parent_call_id: str | None
    model: str                    the model asked for
    endpoint: str                 the base URL, any userinfo removed
    profile: str                  the SSE profile ("strict", "lenient_finish_null")
    cache: "off" | "hit" | "miss"
    cache_salt: str | None
    cache_write: "written" | "failed" | "skipped" | None
                                  None when the cache is off or hit; "skipped" for a `length`
                                  (unless cache_length) or another non-"stop" finish
    finish_reason: str
    usage: dict | None            as the server streamed it
    ttft_ms: float | None         None on a cache hit
    max_inter_token_ms: float | None
    latency_ms: float             the whole call, retries and backoff sleeps included
    attempts: list[Attempt]       empty on a cache hit

call_failed
    call_id, parent_call_id, model, endpoint, profile, cache, cache_salt, latency_ms, attempts:
                                  as above (cache is "off" or "miss")
    error: "retries_exhausted" | "fatal" | "circuit_open" | "cancelled" | "unexpected"
    reason: str                   the last attempt's reason, e.g. "truncated_no_done",
                                  "http_429", "ReadError"; for retries_exhausted the last
                                  transient reason
    status: int | None            the last HTTP status, if any
    detail: str                   short message (<= 300 chars), API key redacted

Attempt (one dict per request sent)
    n: int                        1-based
    outcome: "ok" | "retry" | "failed"
    reason: str | None            None when ok; an SseAnomaly reason, "http_<status>", or the
                                  exception class name
    status: int | None            HTTP status, if a response head arrived
    latency_ms: float
    tokens_discarded: int         content/reasoning delta chunks received and thrown away
                                  (0 when ok)
    sleep_s: float | None         backoff slept before the next attempt

breaker_changed
    from_state: "closed" | "open" | "half_open"
    to_state: "closed" | "open" | "half_open"
    failures: int                 consecutive transient failures at the change
    at: float | None              the clock value at the change (None for a success)
    call_id: str | None           the call that caused it

No payload ever holds the API key or a request header.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trm_store import NewEvent, Store

__all__ = ["StoreEventSink"]


class StoreEventSink:
    """An `EventSink` that appends one event per `emit` to stream `llm:{source}`, its type
    prefixed like every stored type (`call_completed` is stored as `llm.call_completed`)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def emit(self, source: str, event_type: str, data: Mapping[str, Any]) -> None:
        """Append now (synchronously); store errors propagate to the caller, which logs them."""
        self._store.append(f"llm:{source}", [NewEvent(f"llm.{event_type}", dict(data))])
