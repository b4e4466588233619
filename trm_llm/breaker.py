"""Per-source circuit breaker: a small pure state machine over a swappable state store.

closed --N consecutive failures--> open --cooldown over, first caller--> half_open (that caller
holds the probe lease; everyone else is rejected, never queued) --probe success--> closed,
--probe failure--> open again. A probe that never reports loses its lease after
`probe_timeout_s`, so the breaker cannot wedge shut. Fatal 4xx are reported to neither side.

Exactly one probe: `admit` returns an `Admission`, and an outcome reported with it
(`record_success(source, admission=...)`) is attributed. Only the probe's own outcome closes or
reopens a half-open breaker; a late outcome of a call admitted earlier counts toward the failure
count but neither closes the breaker nor frees the probe's lease, and an open breaker closes only
through half-open. An outcome reported without an admission (the SPEC's bare API, where the caller
learnt only `is_open() is False`) is taken as the probe's while half-open, and never closes an
open breaker.

The state lives in memory (one process, guarded by a lock: safe from threads and asyncio) or in
Redis (`redis_client=`, see `trm_llm.breaker_redis`): shared by every process, through
`redis.asyncio` with socket timeouts, degrading to the local state while Redis is unreachable.
In async code use the `a`-methods (`aadmit`, `arecord_success`, ...), which never block the
loop. With Redis, pass wall-clock times (`time.time()`) as `now`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from trm_llm.errors import LLMConfigError

if TYPE_CHECKING:
    import redis
    import redis.asyncio

    from trm_llm.protocols import EventSink

__all__ = ["Admission", "BreakerState", "CircuitBreaker", "Snapshot", "Transition"]

BreakerState = Literal["closed", "open", "half_open"]
T = TypeVar("T")


@dataclass(frozen=True)
class Snapshot:
    """One source's breaker state; `lease` is the token of the live probe, if any."""

    state: BreakerState = "closed"
    failures: int = 0
    open_until: float = 0.0
    lease: str | None = None


@dataclass(frozen=True)
class Transition:
    """A state change, for the caller to report (`breaker_changed`)."""

    source: str
    from_state: BreakerState
    to_state: BreakerState
    failures: int
    at: float | None


@dataclass(frozen=True)
class Admission:
    """The answer to "may I call?", and the ticket its outcome is reported with.

    `probe_token` is set for the one probe of a half-open breaker; such a call must later
    report, or release its token."""

    allowed: bool
    probe_token: str | None = None
    transition: Transition | None = None


Update = Callable[[Snapshot], tuple[Snapshot, T]]


class StateStore(Protocol):
    """Where the snapshots live: `update` applies `fn` atomically to one source's snapshot,
    after dropping a lease whose probe timed out."""

    def update(self, source: str, now: float | None, fn: Update[T]) -> T: ...

    async def aupdate(self, source: str, now: float | None, fn: Update[T]) -> T: ...

    async def aclose(self) -> None: ...


class CircuitBreaker:
    """Admits, rejects and records per source; see the module docstring for the states."""

    def __init__(
        self,
        fail_threshold: int = 5,
        cooldown_s: float = 30.0,
        probe_timeout_s: float = 60.0,
        *,
        redis_client: redis.Redis | redis.asyncio.Redis | None = None,
        namespace: str = "trm:breaker",
        redis_timeout_s: float = 0.5,
        redis_retry_s: float = 5.0,
        sink: EventSink | None = None,
    ) -> None:
        if isinstance(fail_threshold, bool) or fail_threshold < 1:
            raise LLMConfigError(f"fail_threshold must be an int >= 1, got {fail_threshold!r}")
        if not cooldown_s >= 0 or not probe_timeout_s > 0:
            raise LLMConfigError("cooldown_s must be >= 0 and probe_timeout_s > 0")
        self.fail_threshold = fail_threshold
        self.cooldown_s = cooldown_s
        self.probe_timeout_s = probe_timeout_s
        if redis_client is None:
            self._store: StateStore = MemoryStore(probe_timeout_s)
        else:
            from trm_llm.breaker_redis import RedisStore

            self._store = RedisStore(
                redis_client,
                namespace,
                probe_timeout_s,
                timeout_s=redis_timeout_s,
                retry_s=redis_retry_s,
                sink=sink,
            )

    # -- the pure transitions ---------------------------------------------------------------

    def _admit(self, source: str, now: float) -> Update[Admission]:
        def fn(s: Snapshot) -> tuple[Snapshot, Admission]:
            if s.state == "closed":
                return s, Admission(True)
            if s.state == "open" and now < s.open_until:
                return s, Admission(False)
            if s.lease is not None:  # half-open with a live probe
                return s, Admission(False)
            token = uuid.uuid4().hex
            new = replace(s, state="half_open", lease=token)
            return new, Admission(True, token, _transition(source, s, new, now))

        return fn

    def _failure(
        self, source: str, now: float, admission: Admission | None
    ) -> Update[Transition | None]:
        def fn(s: Snapshot) -> tuple[Snapshot, Transition | None]:
            failures = s.failures + 1
            probe_failed = s.state == "half_open" and _is_probe(s, admission)
            if probe_failed or (s.state == "closed" and failures >= self.fail_threshold):
                new = Snapshot("open", failures, now + self.cooldown_s, None)
            else:  # counted; an open breaker stays open, a probe keeps its lease
                new = replace(s, failures=failures)
            return new, _transition(source, s, new, now)

        return fn

    def _success(self, source: str, admission: Admission | None) -> Update[Transition | None]:
        def fn(s: Snapshot) -> tuple[Snapshot, Transition | None]:
            if s.state == "open" or (s.state == "half_open" and not _is_probe(s, admission)):
                return s, None  # a late success: open -> closed only through the probe
            new = Snapshot()
            return new, _transition(source, s, new, None)

        return fn

    def _force_open(self, source: str, now: float) -> Update[Transition | None]:
        def fn(s: Snapshot) -> tuple[Snapshot, Transition | None]:
            failures = max(s.failures, self.fail_threshold)
            new = Snapshot("open", failures, now + self.cooldown_s, None)
            return new, _transition(source, s, new, now)

        return fn

    @staticmethod
    def _release(token: str) -> Update[None]:
        def fn(s: Snapshot) -> tuple[Snapshot, None]:
            return (replace(s, lease=None) if s.lease == token else s), None

        return fn

    # -- the synchronous API (threads, scripts; SPEC §6) ------------------------------------

    def admit(self, source: str, now: float) -> Admission:
        """Closed: allowed. Open: rejected. Cooldown over: exactly one caller gets the probe."""
        return self._store.update(source, now, self._admit(source, now))

    def is_open(self, source: str, now: float) -> bool:
        """True if a call must not be sent now; False admits it (possibly as the one probe)."""
        return not self.admit(source, now).allowed

    def record_failure(
        self, source: str, now: float, *, admission: Admission | None = None
    ) -> Transition | None:
        """A transient failure: opens at the threshold; the probe's failure reopens at once."""
        return self._store.update(source, now, self._failure(source, now, admission))

    def record_success(
        self, source: str, *, now: float | None = None, admission: Admission | None = None
    ) -> Transition | None:
        """A success closes a closed or (the probe's) half-open breaker, resetting the count."""
        return self._store.update(source, now, self._success(source, admission))

    def force_open(self, source: str, now: float) -> Transition | None:
        """Open now for a full cooldown, whatever the state (operator's brake)."""
        return self._store.update(source, now, self._force_open(source, now))

    def release_probe(self, source: str, token: str) -> None:
        """Give the probe lease back unjudged (cancelled or fatal probe); no-op if not ours."""
        self._store.update(source, None, self._release(token))

    def snapshot(self, source: str, now: float) -> Snapshot:
        """The current state, for display and tests; changes nothing."""
        return self._store.update(source, now, _unchanged)

    # -- the async API (never blocks the event loop) -----------------------------------------

    async def aadmit(self, source: str, now: float) -> Admission:
        """`admit`, for async code."""
        return await self._store.aupdate(source, now, self._admit(source, now))

    async def arecord_failure(
        self, source: str, now: float, *, admission: Admission | None = None
    ) -> Transition | None:
        """`record_failure`, for async code."""
        return await self._store.aupdate(source, now, self._failure(source, now, admission))

    async def arecord_success(
        self, source: str, *, now: float | None = None, admission: Admission | None = None
    ) -> Transition | None:
        """`record_success`, for async code."""
        return await self._store.aupdate(source, now, self._success(source, admission))

    async def arelease_probe(self, source: str, token: str) -> None:
        """`release_probe`, for async code."""
        await self._store.aupdate(source, None, self._release(token))

    async def asnapshot(self, source: str, now: float) -> Snapshot:
        """`snapshot`, for async code."""
        return await self._store.aupdate(source, now, _unchanged)

    async def aclose(self) -> None:
        """Close the Redis connections this breaker opened (none for the local state)."""
        await self._store.aclose()


def _unchanged(s: Snapshot) -> tuple[Snapshot, Snapshot]:
    return s, s


def _is_probe(s: Snapshot, admission: Admission | None) -> bool:
    """Whether an outcome judges the half-open breaker: the live probe's own, or unattributed."""
    return admission is None or (
        admission.probe_token is not None and admission.probe_token == s.lease
    )


def _transition(source: str, old: Snapshot, new: Snapshot, at: float | None) -> Transition | None:
    if old.state == new.state:
        return None
    return Transition(source, old.state, new.state, new.failures, at)


class MemoryStore:
    """One process: a dict under a lock; a lease expires `probe_timeout_s` after it was taken."""

    def __init__(self, probe_timeout_s: float) -> None:
        self._probe_timeout_s = probe_timeout_s
        self._lock = threading.Lock()
        self._states: dict[str, Snapshot] = {}
        self._lease_expiry: dict[str, float] = {}

    def update(self, source: str, now: float | None, fn: Update[T]) -> T:
        with self._lock:
            old = self._states.get(source, Snapshot())
            if old.lease is not None and now is not None and now >= self._lease_expiry[source]:
                old = replace(old, lease=None)
            new, result = fn(old)
            if new.lease is not None and new.lease != old.lease and now is not None:
                self._lease_expiry[source] = now + self._probe_timeout_s
            self._states[source] = new
            return result

    async def aupdate(self, source: str, now: float | None, fn: Update[T]) -> T:
        return self.update(source, now, fn)  # a dict under a lock held for microseconds

    async def aclose(self) -> None:
        return None
