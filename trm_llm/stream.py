"""One streamed attempt over HTTP: POST, check the response head, read SSE under stall timers.

The stall timers count only events that make progress (content or reasoning text, a
finish_reason, `[DONE]`): a watchdog on the event loop looks at the time of the last such event,
so keep-alive comments and empty data events (`{"choices": []}`, a role-only delta) never push
it back. The watchdog re-arms itself lazily, so an event costs one attribute store, not a timer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import SSEError, aconnect_sse

from trm_llm.errors import SseAnomaly
from trm_llm.sse import SseDecoder, SseProfile, StreamAccumulator, StreamResult

__all__ = ["StreamTiming", "stream_chat"]


@dataclass
class StreamTiming:
    """Filled while a stream is read, so a failed attempt still knows what it threw away."""

    status: int | None = None
    data_events: int = 0
    text_events: int = 0
    ttft_ms: float | None = None
    max_gap_ms: float | None = None


class _Watchdog:
    """Cancels the reading task once no progress event arrived within the current limit."""

    def __init__(self, first_s: float, inter_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "stream_chat must run inside a task"
        self._task = task
        self._inter_s = inter_s
        self.limit_s = first_s
        self.last = self._loop.time()
        self.fired = False
        self._handle = self._loop.call_at(self.last + first_s, self._check)

    def data(self, now: float) -> None:
        self.last = now
        if self.limit_s != self._inter_s:  # the first data event: switch to the inter limit
            self.limit_s = self._inter_s
            if now + self._inter_s < self._handle.when():  # it is shorter: check sooner
                self._handle.cancel()
                self._handle = self._loop.call_at(now + self._inter_s, self._check)

    def _check(self) -> None:
        due = self.last + self.limit_s
        if self._loop.time() >= due:
            self.fired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_at(due, self._check)

    def close(self) -> None:
        self._handle.cancel()


async def stream_chat(
    http: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    profile: SseProfile,
    *,
    first_token_s: float,
    inter_token_s: float,
    timing: StreamTiming,
) -> StreamResult:
    """Send one request and read it to a complete answer; raise on anything less."""
    decoder = SseDecoder()
    acc = StreamAccumulator(profile)
    watchdog = _Watchdog(first_token_s, inter_token_s)
    started = last_text = watchdog.last
    clock = asyncio.get_running_loop().time
    try:
        async with aconnect_sse(http, "POST", url, json=body, headers=headers) as sse:
            response = sse.response
            timing.status = response.status_code
            await _check_response(response)
            async for chunk in response.aiter_bytes():
                for event in decoder.feed(chunk):
                    now = clock()
                    timing.data_events += 1
                    progress = acc.progress
                    carried = acc.feed_event(event)
                    if acc.progress != progress:
                        watchdog.data(now)
                    if carried:
                        timing.text_events += 1
                        if timing.ttft_ms is None:
                            timing.ttft_ms = (now - started) * 1000
                        else:
                            gap = (now - last_text) * 1000
                            timing.max_gap_ms = max(timing.max_gap_ms or 0.0, gap)
                        last_text = now
            for event in decoder.end():
                acc.feed_event(event)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not watchdog.fired or task is None or task.uncancel() > 0:
            raise  # cancelled from outside
        if not acc.done:  # a stall after [DONE] only delays the end of the body
            first = acc.progress == 0
            raise SseAnomaly(
                "stall_first_token" if first else "stall_inter_token",
                f"no content or finish for {watchdog.limit_s}s",
            ) from None
    finally:
        watchdog.close()
    return acc.finish()


async def _check_response(response: httpx.Response) -> None:
    """Raise for a non-2xx status (body read, for the quota check) or a non-SSE content type."""
    if not response.is_success:
        await response.aread()
        raise httpx.HTTPStatusError(
            f"HTTP {response.status_code}", request=response.request, response=response
        )
    content_type = response.headers.get("content-type", "").partition(";")[0].strip()
    if content_type.lower() != "text/event-stream":  # media types are case-insensitive
        raise SSEError(f"expected Content-Type text/event-stream, got {content_type!r}")
