"""Per-source circuit breaker: a small pure state machine over a swappable state store.

closed --N consecutive failures--> open --cooldown over, first caller--> half_open (that caller
holds the probe lease; everyone else is rejected, never queued) --probe success--> closed,
--probe failure--> open again. A probe that never reports loses its lease after
`probe_timeout_s`, so the breaker cannot wedge shut. Fatal 4xx are reported to neither side.

The state lives in memory (one process, guarded by a lock: safe from threads and asyncio) or in
Redis (`redis=`): a hash per source plus a `SET NX PX` probe lease, updated under WATCH so several
processes admit one probe in all. With Redis, pass wall-clock times (`time.time()`) as `now`:
every process compares against the same `open_until`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeVar, cast

import redis

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
    """The answer to "may I call?"; a probe must later report, or release its token."""

    allowed: bool
    probe_token: str | None = None
    transition: Transition | None = None


Update = Callable[[Snapshot], tuple[Snapshot, T]]


class _Store(Protocol):
    def update(self, source: str, now: float | None, fn: Update[T]) -> T: ...


class CircuitBreaker:
    """Admits, rejects and records per source; see the module docstring for the states."""

    def __init__(
        self,
        fail_threshold: int = 5,
        cooldown_s: float = 30.0,
        probe_timeout_s: float = 60.0,
        *,
        redis_client: redis.Redis | None = None,
        namespace: str = "trm:breaker",
    ) -> None:
        if isinstance(fail_threshold, bool) or fail_threshold < 1:
            raise ValueError(f"fail_threshold must be an int >= 1, got {fail_threshold!r}")
        if not cooldown_s >= 0 or not probe_timeout_s > 0:
            raise ValueError("cooldown_s must be >= 0 and probe_timeout_s > 0")
        self.fail_threshold = fail_threshold
        self.cooldown_s = cooldown_s
        self.probe_timeout_s = probe_timeout_s
        self._store: _Store = (
            _MemoryStore(probe_timeout_s)
            if redis_client is None
            else _RedisStore(redis_client, namespace, probe_timeout_s)
        )

    def admit(self, source: str, now: float) -> Admission:
        """Closed: allowed. Open: rejected. Cooldown over: exactly one caller gets the probe."""

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

        return self._store.update(source, now, fn)

    def is_open(self, source: str, now: float) -> bool:
        """True if a call must not be sent now; False admits it (possibly as the one probe)."""
        return not self.admit(source, now).allowed

    def record_failure(self, source: str, now: float) -> Transition | None:
        """A transient failure: opens at the threshold; a failed probe reopens at once."""

        def fn(s: Snapshot) -> tuple[Snapshot, Transition | None]:
            failures = s.failures + 1
            if s.state == "half_open" or (s.state == "closed" and failures >= self.fail_threshold):
                new = Snapshot("open", failures, now + self.cooldown_s, None)
            else:
                new = replace(s, failures=failures)
            return new, _transition(source, s, new, now)

        return self._store.update(source, now, fn)

    def record_success(self, source: str) -> Transition | None:
        """A success closes the breaker and resets the consecutive-failure count."""

        def fn(s: Snapshot) -> tuple[Snapshot, Transition | None]:
            new = Snapshot()
            return new, _transition(source, s, new, None)

        return self._store.update(source, None, fn)

    def force_open(self, source: str, now: float) -> Transition | None:
        """Open now for a full cooldown, whatever the state (operator's brake)."""

        def fn(s: Snapshot) -> tuple[Snapshot, Transition | None]:
            failures = max(s.failures, self.fail_threshold)
            new = Snapshot("open", failures, now + self.cooldown_s, None)
            return new, _transition(source, s, new, now)

        return self._store.update(source, now, fn)

    def release_probe(self, source: str, token: str) -> None:
        """Give the probe lease back unjudged (cancelled or fatal probe); no-op if not ours."""

        def fn(s: Snapshot) -> tuple[Snapshot, None]:
            return (replace(s, lease=None) if s.lease == token else s), None

        self._store.update(source, None, fn)

    def snapshot(self, source: str, now: float) -> Snapshot:
        """The current state, for display and tests; changes nothing."""
        return self._store.update(source, now, lambda s: (s, s))


def _transition(source: str, old: Snapshot, new: Snapshot, at: float | None) -> Transition | None:
    if old.state == new.state:
        return None
    return Transition(source, old.state, new.state, new.failures, at)


class _MemoryStore:
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


class _RedisStore:
    """Shared: hash `{ns}:{source}:state`, lease `{ns}:{source}:probe` (SET NX PX), under WATCH."""

    def __init__(self, client: redis.Redis, namespace: str, probe_timeout_s: float) -> None:
        self._redis = client
        self._namespace = namespace
        self._lease_ms = max(1, round(probe_timeout_s * 1000))

    def keys(self, source: str) -> tuple[str, str]:
        return f"{self._namespace}:{source}:state", f"{self._namespace}:{source}:probe"

    def update(self, source: str, now: float | None, fn: Update[T]) -> T:
        state_key, lease_key = self.keys(source)

        with self._redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(state_key, lease_key)  # type: ignore[no-untyped-call]
                    old = _decode(pipe.hgetall(state_key), pipe.get(lease_key))
                    new, result = fn(old)
                    if new != old:
                        pipe.multi()
                        self._write(pipe, state_key, lease_key, old, new)
                        pipe.execute()
                    return result
                except redis.WatchError:
                    continue
                finally:
                    pipe.reset()

    def _write(
        self, pipe: Any, state_key: str, lease_key: str, old: Snapshot, new: Snapshot
    ) -> None:
        fields = {"state": new.state, "failures": new.failures, "open_until": repr(new.open_until)}
        pipe.hset(state_key, mapping=fields)
        if new.lease is None and old.lease is not None:
            pipe.delete(lease_key)
        elif new.lease is not None and new.lease != old.lease:
            pipe.set(lease_key, new.lease, nx=True, px=self._lease_ms)


def _decode(raw: dict[Any, Any], lease: Any) -> Snapshot:
    fields = {_text(k): _text(v) for k, v in raw.items()}
    state = fields.get("state", "closed")
    if state not in ("closed", "open", "half_open"):
        raise ValueError(f"corrupt breaker state {state!r} in Redis")
    return Snapshot(
        cast(BreakerState, state),
        int(fields.get("failures", "0")),
        float(fields.get("open_until", "0")),
        None if lease is None else _text(lease),
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
