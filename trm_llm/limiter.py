"""Adaptive concurrency: how many calls an endpoint sustains in flight, learnt from its replies.

`ConcurrencyLimiter` is an AIMD limiter (additive increase, multiplicative decrease, as TCP and
Netflix's concurrency-limits do it) for one endpoint, on one event loop. A call takes a `Slot`
for each attempt (`acquire`, FIFO, waiting while the limit is reached: the caller's deadline
bounds the wait, a cancelled waiter leaves the line) and gives it back with what the attempt
showed (`release`):

- success, while the limit was binding: the limit grows by 1/limit (about +1 per limit's worth
  of successes); towards the level that last overloaded the endpoint it grows `patience` times
  slower, and twice slower again each time that same level overloads it anew (up to 64 times),
  so a server with K slots sees a probe at K+1 only now and then, and ever more rarely; once the
  limit passes that level, the level is forgotten;
- overload: the limit is multiplied by `backoff` (at least down to the floor of 1), once per
  overload episode: the other calls admitted under the old limit report the same overload, and
  shrinking again for each of them would collapse the limit to 1 at the first burst.

Overload or outage (`is_overload_signal`, `Release.handled`): the signals that too many calls in
flight cause are a stream cut after the server accepted it (`RemoteProtocolError`, `ReadError`
once the response head came, or a body that ended before its finish: `truncated_no_done`),
HTTP 429 (rate, not quota: that one is fatal) and 503. Everything else (connection refused, a
timeout, a 500, an error payload, a stall) is not. An overload signal is *handled* (the call
retries once it has a slot again; the breaker is not told) when fewer calls in flight can fix
it: the limit was above the floor, or it shrank since this slot was granted. An overload signal
from a call that was alone under a limit of 1 cannot be fixed that way: it is an outage's
failure like any other, so an endpoint that fails even one call at a time still opens the
breaker.
"""

from __future__ import annotations

import asyncio
import collections
import math
from dataclasses import dataclass
from typing import Literal

import httpx

from trm_llm.errors import LLMConfigError, SseAnomaly

__all__ = [
    "FLOOR",
    "ConcurrencyLimiter",
    "LimitChange",
    "Release",
    "Slot",
    "is_overload_signal",
]

FLOOR = 1
"""The smallest limit: one call in flight is always allowed."""

_MAX_STRIKES = 6
_OVERLOAD_STATUSES = frozenset({429, 503})
_CUT_AFTER_HEAD = (httpx.ReadError, httpx.RemoteProtocolError)


def is_overload_signal(exc: BaseException, status: int | None) -> bool:
    """True if `exc` (one attempt's error; `status` the HTTP status of its response head, if
    one came) is what a server does when it has more calls than it can serve at once."""
    if isinstance(exc, SseAnomaly):
        return exc.reason == "truncated_no_done"
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in _OVERLOAD_STATUSES
    if isinstance(exc, httpx.RemoteProtocolError):
        return True  # the server closed a connection it had accepted (before or mid-reply)
    return isinstance(exc, _CUT_AFTER_HEAD) and status is not None


@dataclass(frozen=True, slots=True)
class LimitChange:
    """The limit moved: `cause` "overload" (shrank) or "success" (grew), with the calls then
    in flight."""

    from_limit: int
    to_limit: int
    cause: Literal["overload", "success"]
    in_flight: int


@dataclass(frozen=True, slots=True)
class Slot:
    """One granted place in flight; `episode` is the limiter's overload count when granted."""

    episode: int
    limit: int


@dataclass(frozen=True, slots=True)
class Release:
    """What giving a slot back did: `handled` for an overload the limiter absorbed (retry it,
    do not count it against the breaker), and the limit's change, if it moved."""

    handled: bool
    change: LimitChange | None = None


class ConcurrencyLimiter:
    """Per-endpoint AIMD limit on calls in flight (see the module docstring); one event loop."""

    def __init__(
        self,
        initial: int = 4,
        *,
        ceiling: int = 64,
        backoff: float = 0.5,
        patience: int = 20,
    ) -> None:
        for name, value in (("initial", initial), ("ceiling", ceiling), ("patience", patience)):
            if isinstance(value, bool) or not isinstance(value, int) or value < FLOOR:
                raise LLMConfigError(f"{name} must be an int >= {FLOOR}, got {value!r}")
        if initial > ceiling:
            raise LLMConfigError(f"initial ({initial}) must not exceed ceiling ({ceiling})")
        if not 0 < backoff < 1:
            raise LLMConfigError(f"backoff must be in (0, 1), got {backoff!r}")
        self.ceiling = ceiling
        self._backoff = backoff
        self._patience = patience
        self._limit = float(initial)
        self._in_flight = 0
        self._episode = 0
        self._overloaded_at: int | None = None  # the limit that last overloaded the endpoint
        self._strikes = 0  # how many times in a row that same level overloaded it
        self._waiters: collections.deque[asyncio.Future[Slot]] = collections.deque()

    def __repr__(self) -> str:
        return (
            f"ConcurrencyLimiter(limit={self.limit}, in_flight={self._in_flight}, "
            f"ceiling={self.ceiling}, waiting={self.waiting})"
        )

    @property
    def limit(self) -> int:
        """Calls allowed in flight now."""
        return max(FLOOR, math.floor(self._limit))

    @property
    def in_flight(self) -> int:
        """Slots granted and not yet released."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Callers waiting for a slot."""
        return sum(not w.done() for w in self._waiters)

    async def acquire(self) -> Slot:
        """A slot, at once if the limit allows, else in turn (FIFO). Cancelled while waiting
        (a deadline, a caller giving up): it leaves the line, holding nothing."""
        if self._in_flight < self.limit and not self.waiting:
            return self._grant()
        waiter: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted as it was cancelled
                self.release(waiter.result(), "neutral")
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def release(self, slot: Slot, outcome: Literal["success", "overload", "neutral"]) -> Release:
        """Give `slot` back with what its attempt showed ("neutral": nothing about load, e.g.
        a cancelled attempt or a failure that is not an overload signal)."""
        saturated = self._in_flight >= self.limit or bool(self.waiting)
        self._in_flight -= 1
        before = self.limit
        handled = False
        cause: Literal["overload", "success"] = "success"
        if outcome == "overload":
            cause = "overload"
            if slot.episode < self._episode:
                handled = True  # this episode already shrank the limit
            elif before > FLOOR:
                handled = True
                same = before == self._overloaded_at
                self._strikes = min(self._strikes + 1, _MAX_STRIKES) if same else 0
                self._overloaded_at = before
                self._episode += 1
                self._limit = max(float(FLOOR), math.floor(before * self._backoff))
        elif outcome == "success" and saturated and self._limit < self.ceiling:
            step = 1 / self._limit
            if self._overloaded_at is not None and before + 1 >= self._overloaded_at:
                step /= self._patience * 2**self._strikes
            self._limit = min(float(self.ceiling), self._limit + step)
            if self._overloaded_at is not None and self.limit > self._overloaded_at:
                self._overloaded_at, self._strikes = None, 0  # that level holds now
        self._wake()
        after = self.limit
        change = None if after == before else LimitChange(before, after, cause, self._in_flight)
        return Release(handled, change)

    def _grant(self) -> Slot:
        self._in_flight += 1
        return Slot(self._episode, self.limit)

    def _wake(self) -> None:
        """Grant waiting callers slots while the limit allows, oldest first."""
        while self._waiters and self._in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._grant())
