"""The governance loop of one `chat()` call, apart from HTTP: cache, breaker, retries, events.

Per call: cache lookup (a hit returns at once) -> a slot from the concurrency limiter (waiting
in line, within the deadline) -> breaker admission -> one streamed attempt -> the slot back,
with what the attempt showed -> on an overload the limiter handled (`trm_llm.limiter`: fewer
calls in flight can fix it) try again once a slot is free, neither counted as an attempt by the
retry policy nor as a failure by the breaker; on another transient failure tell the breaker,
ask the `RetryPolicy`, sleep, try again; on a fatal one stop -> cache only a complete answer ->
exactly one `call_completed` or `call_failed` event, and a `limit_changed` event for each move
of the limit (payloads in `trm_llm.sink`). The breaker and the retry policy's decisions read
`clock`; the deadline (which covers waiting for a slot) is also enforced by an asyncio timeout
around the whole call, so no server (one that drips empty events, or a token every few seconds)
can hold a call past `deadline_s`. A cache whose reads end by themselves well within the deadline
(a `StoredResponseCache` with an `op_timeout_s` below `deadline_s`) is read before that timeout
is armed, and the timeout then gets what is left of `deadline_s`: a cache hit, which never
reaches the endpoint, pays for no call-wide timer (bench/README.md, llm_bench: its cost).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import httpx

from trm_llm.api_key import scrub_exception
from trm_llm.breaker import Admission, CircuitBreaker, Transition
from trm_llm.cache import CachedResponse, ResponseCache
from trm_llm.errors import (
    CircuitOpenError,
    EventSinkError,
    FatalLLMError,
    LLMError,
    RetriesExhausted,
    SseAnomaly,
)
from trm_llm.limiter import ConcurrencyLimiter, LimitChange, Slot, is_overload_signal
from trm_llm.protocols import ChatResult, EventSink
from trm_llm.request_snapshot import snapshot_request
from trm_llm.retry import GiveUp, RetryPolicy, Sleep, is_transient_error, retry_after_of
from trm_llm.sanitise import clean_event, clean_usage
from trm_llm.sse import StreamResult
from trm_llm.stored_cache import StoredResponseCache
from trm_llm.stream import StreamTiming

__all__ = ["Governor"]

logger = logging.getLogger("trm_llm.client")

Attempt = Callable[[dict[str, Any], StreamTiming], Awaitable[StreamResult]]


@dataclass
class _Attempt:
    n: int
    outcome: Literal["ok", "retry", "failed"] = "failed"
    reason: str | None = None
    status: int | None = None
    latency_ms: float = 0.0
    tokens_discarded: int = 0
    sleep_s: float | None = None
    overload: bool = False  # an overload the limiter handled: retried, not a breaker failure

    def payload(self) -> dict[str, Any]:
        """The event's `Attempt` dict: every field is a plain value, so a copy of the fields is
        what `dataclasses.asdict` returns, at a seventh of its cost (its deep copy)."""
        return vars(self).copy()


@dataclass(frozen=True)
class Governor:
    """Everything a call needs besides HTTP; `attempt` sends one request and reads it."""

    model: str
    source: str
    endpoint: str  # for the cache key: the base URL as configured
    shown_endpoint: str  # for events and messages: userinfo removed
    profile: str
    attempt: Attempt
    redact: Callable[[str], str]
    cache: ResponseCache | None
    breaker: CircuitBreaker | None
    limiter: ConcurrencyLimiter | None
    retry: RetryPolicy
    sink: EventSink | None
    cache_length: bool
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[None]]
    rand: Callable[[], float]
    reads_within_deadline: bool = field(init=False, repr=False)
    """`cache.get` ends by itself before `deadline_s` (see the module docstring)."""

    def __post_init__(self) -> None:
        within = _reads_end_within(self.cache, self.retry.deadline_s)
        object.__setattr__(self, "reads_within_deadline", within)

    async def run(
        self,
        messages: Sequence[Mapping[str, Any]],
        params: dict[str, Any],
        parent_call_id: str | None,
        cache_salt: str | None,
    ) -> ChatResult:
        """One governed call (see the module docstring)."""
        return await _Call(self, messages, params, parent_call_id, cache_salt).run()

    def report(self, event_type: str, data: Mapping[str, Any]) -> Awaitable[None] | None:
        """Emit to the sink; a failing emit is logged, never allowed to fail the call. Returns
        what the sink returned: an awaitable that completes when the event is committed."""
        if self.sink is None:
            return None
        try:
            return self.sink.emit(self.source, event_type, data)
        except Exception:
            logger.exception("event sink failed to record %s for %s", event_type, self.source)
            return None


class _Call:
    """The state of one `chat()` call: its attempts, its admission, its single final event."""

    def __init__(
        self,
        governor: Governor,
        messages: Sequence[Mapping[str, Any]],
        params: dict[str, Any],
        parent_call_id: str | None,
        cache_salt: str | None,
    ) -> None:
        self.g = governor
        self.messages, self.params = snapshot_request(messages, params)  # read once: keyed as sent
        self.call_id = uuid.uuid4().hex
        self.started = time.perf_counter()
        self.attempts: list[_Attempt] = []
        self.reported = False  # the call's one event has been sent
        self.deadline: asyncio.Timeout | None = None  # armed once the call may need it
        self.last_error: Exception | None = None
        self.waiting_for_slot = False
        self.notes: list[str] = []  # what was sanitised, for the call's event
        self.answer: tuple[StreamResult, StreamTiming] | None = None  # complete, not reported
        self.receipts: list[Awaitable[None]] = []  # its events, until committed
        self.base: dict[str, Any] = {
            "call_id": self.call_id,
            "parent_call_id": parent_call_id,
            "model": governor.model,
            "endpoint": governor.shown_endpoint,
            "profile": governor.profile,
            "cache": "off" if governor.cache is None else "miss",
            "cache_salt": cache_salt,
        }

    async def run(self) -> ChatResult:
        """The call, returning (or raising) only once its events are committed."""
        try:
            result = await self._bounded()
        except Exception:
            if self.receipts:
                await self._committed(raise_error=False)  # the call's own error goes first
            raise
        if self.receipts:  # none without a sink: nothing to wait for
            await self._committed(raise_error=True)
        return result

    async def _committed(self, *, raise_error: bool) -> None:
        for receipt in self.receipts:
            try:
                await receipt
            except Exception as exc:
                if raise_error:
                    if isinstance(exc, EventSinkError):
                        raise
                    raise EventSinkError(f"the sink failed: {type(exc).__name__}") from exc
                logger.exception("the event of call %s was not committed", self.call_id)

    def _report(self, event_type: str, data: Mapping[str, Any]) -> None:
        receipt = self.g.report(event_type, data)
        if receipt is not None:
            self.receipts.append(receipt)

    async def _bounded(self) -> ChatResult:
        """The governed call under one asyncio timeout of `deadline_s`: every cache operation,
        attempt and backoff sleep, whatever the server sends. A cache that bounds its own reads
        within the deadline is read first, with no timeout armed (see the module docstring)."""
        g = self.g
        key = None
        if g.cache is not None:  # bad key input raises here, before the call is under way
            key = g.cache.build_key(
                g.model, self.messages, self.base["cache_salt"], self.params, endpoint=g.endpoint
            )
        looked_up = key is not None and g.reads_within_deadline
        if looked_up:
            assert g.cache is not None and key is not None
            try:
                hit = await g.cache.get(key)
                if hit is not None:
                    return self._hit(hit)
            except BaseException as exc:
                self._unexpected(exc)
                raise
        left = g.retry.deadline_s - (time.perf_counter() - self.started)
        self.deadline = deadline = asyncio.timeout(left)
        try:
            async with deadline:
                return await self._governed(key, looked_up)
        except TimeoutError:
            if not deadline.expired():
                raise
            if self.answer is not None and not self.reported:  # only its cache write was cut
                result, timing = self.answer
                self._completed(
                    result.finish_reason, result.usage, timing.ttft_ms, timing.max_gap_ms, "failed"
                )
                return self._result(result, timing)
            raise self._deadline_passed() from None

    async def _governed(self, key: str | None, looked_up: bool) -> ChatResult:
        """The call after the cache lookup, or with it if `looked_up` is False."""
        g = self.g
        body = {"model": g.model, "messages": list(self.messages), **self.params, "stream": True}
        try:
            if g.cache is not None and key is not None and not looked_up:
                hit = await g.cache.get(key)
                if hit is not None:
                    return self._hit(hit)
            start_clock = g.clock()
            while True:
                slot = await self._slot()
                try:
                    admission = await self._admit()
                except BaseException:
                    self._free(slot, "neutral")
                    raise
                if not admission.allowed:
                    self._free(slot, "neutral")
                    raise self._circuit_open()
                attempt = _Attempt(len(self.attempts) + 1)
                self.attempts.append(attempt)
                timing = StreamTiming()
                t0 = time.perf_counter()
                try:
                    result = await g.attempt(body, timing)
                except Exception as exc:
                    self.last_error = exc
                    attempt.latency_ms, attempt.status = _ms(t0), timing.status
                    attempt.reason, attempt.tokens_discarded = _reason(exc), timing.text_events
                    overload = is_overload_signal(exc, timing.status)
                    if self._free(slot, "overload" if overload else "neutral", attempt.reason):
                        await self._release(admission)  # not the endpoint's failure
                        attempt.outcome, attempt.overload = "retry", True
                        attempt.sleep_s = self._overload_pause(exc)
                        if attempt.sleep_s:
                            await g.sleep(attempt.sleep_s)
                        continue
                    decision = await self._judge(exc, admission, start_clock)
                    if isinstance(decision, GiveUp):
                        raise self._give_up(exc, decision) from exc
                    attempt.outcome, attempt.sleep_s = "retry", decision.delay_s
                    await g.sleep(decision.delay_s)
                    continue
                except BaseException:
                    attempt.latency_ms, attempt.reason = _ms(t0), "cancelled"
                    self._free(slot, "neutral")
                    await self._release(admission)  # nothing was learned about the provider
                    raise
                self._free(slot, "success")
                attempt.outcome, attempt.latency_ms, attempt.status = "ok", _ms(t0), timing.status
                if g.breaker is not None:
                    success = g.breaker.arecord_success
                    self._breaker_event(await success(g.source, now=g.clock(), admission=admission))
                return await self._complete(result, timing, key)
        except BaseException as exc:
            self._unexpected(exc)
            raise

    def _unexpected(self, exc: BaseException) -> None:
        """Cancelled, or a bug: still exactly one event per call. Raises the `FatalLLMError`
        that stands for `exc` unless it is an `LLMError` or a cancellation (the caller then
        re-raises `exc`)."""
        g = self.g
        scrub_exception(exc, g.redact)
        deadline_passed = self.deadline is not None and self.deadline.expired()
        if not self.reported and not deadline_passed:  # run() reports a deadline
            cancelled = not isinstance(exc, Exception)
            error = "cancelled" if cancelled else "unexpected"
            reason = error if cancelled else type(exc).__name__
            self._fail(error, reason, None, g.redact(str(exc)))
        if isinstance(exc, Exception) and not isinstance(exc, LLMError):
            # chat() raises LLMErrors only: whatever a cache, a sink or a bug threw.
            detail = g.redact(_describe(exc))[:300]
            raise FatalLLMError(f"unexpected {type(exc).__name__}: {detail}") from exc

    async def _admit(self) -> Admission:
        breaker = self.g.breaker
        if breaker is None:
            return Admission(True)
        admission = await breaker.aadmit(self.g.source, self.g.clock())
        self._breaker_event(admission.transition)
        return admission

    async def _slot(self) -> Slot | None:
        """A place in flight for the next attempt, waited for within the call's deadline."""
        if self.g.limiter is None:
            return None
        self.waiting_for_slot = True
        slot = await self.g.limiter.acquire()
        self.waiting_for_slot = False
        return slot

    def _free(
        self, slot: Slot | None, outcome: Literal["success", "overload", "neutral"], why: str = ""
    ) -> bool:
        """Give the attempt's slot back; True if it was an overload the limiter handled."""
        if slot is None or self.g.limiter is None:
            return False
        release = self.g.limiter.release(slot, outcome)
        if release.change is not None:
            self._limit_event(release.change, why if release.change.cause == "overload" else "")
        return release.handled

    def _overload_pause(self, exc: Exception) -> float | None:
        """A handled overload waits for its slot, not a backoff; but a Retry-After is kept."""
        after = retry_after_of(exc, now=time.time())
        return None if after is None else min(after, self.g.retry.retry_after_cap_s)

    async def _release(self, admission: Admission) -> None:
        if self.g.breaker is not None and admission.probe_token is not None:
            await self.g.breaker.arelease_probe(self.g.source, admission.probe_token)

    async def _judge(
        self, exc: Exception, admission: Admission, start_clock: float
    ) -> Sleep | GiveUp:
        """Tell the breaker what happened, then ask the retry policy what to do."""
        g = self.g
        now = g.clock()
        if is_transient_error(exc) and g.breaker is not None:
            failure = g.breaker.arecord_failure
            self._breaker_event(await failure(g.source, now, admission=admission))
        else:
            await self._release(admission)
        return g.retry.decide(
            attempt=sum(not a.overload for a in self.attempts),
            error=exc,
            elapsed_s=now - start_clock,
            rand=g.rand(),
            retry_after_s=retry_after_of(exc, now=time.time()),  # HTTP-dates are wall time
        )

    def _give_up(self, exc: Exception, decision: GiveUp) -> Exception:
        """The error to raise after the final attempt, its `call_failed` event already sent."""
        status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
        detail = self.g.redact(_describe(exc))
        if decision.why != "fatal":
            self._fail("retries_exhausted", _reason(exc), status, detail)
            error: LLMError = RetriesExhausted(exc, attempts=len(self.attempts), why=decision.why)
        else:  # an HTTP status, a transport or decoding error, a body httpx cannot send
            self._fail("fatal", _reason(exc), status, detail)
            error = FatalLLMError(
                f"{_reason(exc)} from {self.g.shown_endpoint}: {detail}", status=status
            )
        return error

    def _deadline_passed(self) -> LLMError:
        """`deadline_s` passed mid-call (in an attempt, a backoff or a cache operation)."""
        limit = self.g.retry.deadline_s
        last = self.attempts[-1] if self.attempts else None
        if last is not None and last.reason == "cancelled":  # the timeout cancelled it
            last.reason = "deadline"
        detail = f"the call's deadline of {limit}s passed after {len(self.attempts)} attempt(s)"
        if self.waiting_for_slot and self.g.limiter is not None:
            detail += f", waiting for one of {self.g.limiter.limit} slots in flight"
        self._fail("retries_exhausted", "deadline", last.status if last else None, detail)
        error = self.last_error or TimeoutError(detail)
        return RetriesExhausted(error, attempts=len(self.attempts), why="deadline")

    def _circuit_open(self) -> Exception:
        error = CircuitOpenError(self.g.source)
        if not self.attempts:
            self._fail("circuit_open", "circuit_open", None, str(error))
            return error
        # Our own failures opened it mid-call: report them, not only the rejection, and keep
        # the last attempt's own error (a refused connection, a 500) as the call's last error.
        last = self.attempts[-1]
        detail = str(error)
        if self.last_error is not None:
            detail = f"{self.g.redact(_describe(self.last_error))}; then {error}"
        self._fail("retries_exhausted", last.reason or "circuit_open", last.status, detail)
        cause = self.last_error or error
        return RetriesExhausted(cause, attempts=len(self.attempts), why="circuit_open")

    def _fail(self, error: str, reason: str, status: int | None, detail: str) -> None:
        self.reported = True
        if self.g.sink is None:
            return
        if self.attempts and self.attempts[-1].outcome != "retry":
            self.attempts[-1].outcome = "failed"
        payload = {
            **self.base,
            "latency_ms": _ms(self.started),
            "attempts": [a.payload() for a in self.attempts],
            "error": error,
            "reason": reason,
            "status": status,
            "detail": detail[:300],
        }
        self._report("call_failed", clean_event(payload, self.notes))

    def _hit(self, hit: CachedResponse) -> ChatResult:
        self.base["cache"] = "hit"
        self._completed(hit.finish_reason, hit.usage, None, None, None)
        return self._result(hit, None)

    async def _complete(
        self, result: StreamResult, timing: StreamTiming, key: str | None
    ) -> ChatResult:
        usage, self.notes = clean_usage(result.usage)  # storable in the cache and the event
        result = replace(result, usage=usage)
        self.answer = (result, timing)
        cache_write = None
        if self.g.cache is not None and key is not None:
            cache_write = "skipped"
            if result.finish_reason == "stop" or (
                result.finish_reason == "length" and self.g.cache_length
            ):
                value = CachedResponse(
                    content=result.content,
                    reasoning=result.reasoning,
                    finish_reason=result.finish_reason,
                    usage=result.usage,
                    model=result.model or self.g.model,
                )
                cache_write = "written" if await self.g.cache.set(key, value) else "failed"
        self._completed(
            result.finish_reason, result.usage, timing.ttft_ms, timing.max_gap_ms, cache_write
        )
        return self._result(result, timing)

    def _result(
        self, answer: StreamResult | CachedResponse, timing: StreamTiming | None
    ) -> ChatResult:
        """What `chat()` returns; no timing means a cache hit."""
        return ChatResult(
            content=answer.content,
            reasoning=answer.reasoning,
            finish_reason=answer.finish_reason,
            usage=answer.usage,
            cached=timing is None,
            attempts=0 if timing is None else len(self.attempts),
            call_id=self.call_id,
            ttft_ms=None if timing is None else timing.ttft_ms,
            max_inter_token_ms=None if timing is None else timing.max_gap_ms,
        )

    def _completed(
        self,
        finish_reason: str,
        usage: dict[str, Any] | None,
        ttft_ms: float | None,
        max_gap_ms: float | None,
        cache_write: str | None,
    ) -> None:
        self.reported = True
        if self.g.sink is None:
            return
        payload = {
            **self.base,
            "cache_write": cache_write,
            "finish_reason": finish_reason,
            "usage": usage,
            "ttft_ms": ttft_ms,
            "max_inter_token_ms": max_gap_ms,
            "latency_ms": _ms(self.started),
            "attempts": [a.payload() for a in self.attempts],
        }
        self._report("call_completed", clean_event(payload, self.notes))

    def _limit_event(self, change: LimitChange, reason: str) -> None:
        assert self.g.limiter is not None
        self._report(
            "limit_changed",
            {
                "from_limit": change.from_limit,
                "to_limit": change.to_limit,
                "cause": change.cause,
                "reason": reason or None,
                "in_flight": change.in_flight,
                "ceiling": self.g.limiter.ceiling,
                "call_id": self.call_id,
            },
        )

    def _breaker_event(self, transition: Transition | None) -> None:
        if transition is None:
            return
        self._report(
            "breaker_changed",
            {
                "from_state": transition.from_state,
                "to_state": transition.to_state,
                "failures": transition.failures,
                "at": transition.at,
                "call_id": self.call_id,
            },
        )


def _reads_end_within(cache: ResponseCache | None, deadline_s: float) -> bool:
    """True if every `cache.get` ends by itself before `deadline_s`: the shared `get` of a
    `StoredResponseCache` (not overridden), bounded by an `op_timeout_s` below the deadline."""
    if not isinstance(cache, StoredResponseCache) or type(cache).get is not StoredResponseCache.get:
        return False
    return cache.op_timeout_s is not None and cache.op_timeout_s < deadline_s


def _reason(exc: BaseException) -> str:
    if isinstance(exc, SseAnomaly):
        return exc.reason
    if isinstance(exc, httpx.HTTPStatusError):
        return f"http_{exc.response.status_code}"
    return type(exc).__name__


def _describe(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        try:
            body = exc.response.text
        except httpx.ResponseNotRead:
            body = ""
        return f"{exc} {body[:200]}".strip()
    return str(exc) or type(exc).__name__


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)
