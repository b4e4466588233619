"""The seams of trm_llm: what a caller talks to and gets back, and where events go.

`LLMProvider` is what harness code depends on (the governed client and every wrapper, such as
the vision wrapper, satisfy it, and each forwards `cache_salt`); `ChatResult` is what it returns.
`EventSink` is how trm_llm reports calls without importing the store: `StoreEventSink` writes to
trm_store, tests pass a list-backed sink, and `None` means "report nowhere".
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["ChatResult", "EventSink", "LLMProvider"]


@dataclass(frozen=True)
class ChatResult:
    """A complete answer. `finish_reason == "length"` means max_tokens cut it: flagged, not
    cached unless the client was built with `cache_length=True`. A cache hit has `cached=True`,
    `attempts=0` and no timings."""

    content: str
    reasoning: str | None
    finish_reason: str
    usage: dict[str, Any] | None
    cached: bool
    attempts: int
    call_id: str
    ttft_ms: float | None
    max_inter_token_ms: float | None


@runtime_checkable
class EventSink(Protocol):
    """Receives one event; must not raise for a well-formed event (report, don't crash).

    A sink that writes later (`StoreEventSink` on an event loop) returns an awaitable that
    completes once the event is committed; the governed client awaits it before `chat()`
    returns. A sink that is done when `emit` returns returns None."""

    def emit(
        self, source: str, event_type: str, data: Mapping[str, Any]
    ) -> Awaitable[None] | None: ...


@runtime_checkable
class LLMProvider(Protocol):
    """An async chat-completion provider; `cache_salt` must reach the cache key unchanged."""

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        parent_call_id: str | None = None,
        cache_salt: str | None = None,
        **params: Any,
    ) -> ChatResult: ...
