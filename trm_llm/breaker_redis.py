"""The breaker's state shared through Redis, never blocking the loop, degrading when Redis fails.

Per source a hash `{ns}:{source}:state` and a probe lease `{ns}:{source}:probe` (`SET NX PX`,
so a probe that never reports loses it after `probe_timeout_s`), read and written under WATCH so
several processes admit one probe in all. Every Redis command goes through `redis.asyncio` with
socket timeouts, and each update runs under an `asyncio.timeout`: a stopped (SIGSTOP) or down
Redis costs a call at most about `timeout_s`. Then the breaker degrades: it keeps its state in
process memory, logs a warning and emits `breaker_degraded` (source "breaker"); every
`retry_s` one update tries Redis again, and the first that succeeds switches back (the shared state
is the truth again), logs and emits `breaker_restored`.

The connections are the breaker's own (to the server `redis_client` points at: host, port, db,
credentials or unix socket), one client per event loop. The synchronous API runs the same code on
a short-lived event loop of its own (one connection per call: for scripts and tests).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import redis
import redis.asyncio
from redis.exceptions import RedisError, WatchError

from trm_llm.breaker import BreakerState, MemoryStore, Snapshot, Update
from trm_llm.errors import LLMConfigError
from trm_llm.protocols import EventSink

__all__ = ["BREAKER_EVENT_SOURCE", "RedisStore"]

logger = logging.getLogger("trm_llm.breaker")
T = TypeVar("T")
BREAKER_EVENT_SOURCE = "breaker"
"""The `source` the degraded / restored events are emitted under (stream `llm:breaker`)."""


class RedisStore:
    """A `StateStore` in Redis, with the local state as the fallback while Redis is unreachable."""

    def __init__(
        self,
        client: redis.Redis | redis.asyncio.Redis,
        namespace: str,
        probe_timeout_s: float,
        *,
        timeout_s: float,
        retry_s: float,
        sink: EventSink | None,
    ) -> None:
        if not timeout_s > 0 or not retry_s >= 0:
            raise LLMConfigError("redis_timeout_s must be > 0 and redis_retry_s >= 0")
        self._address = _address(client.connection_pool.connection_kwargs)
        self._namespace = namespace
        self._lease_ms = max(1, round(probe_timeout_s * 1000))
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._sink = sink
        self._local = MemoryStore(probe_timeout_s)
        self._degraded_until: float | None = None  # monotonic time of the next Redis try
        self._clients: dict[asyncio.AbstractEventLoop, redis.asyncio.Redis] = {}

    @property
    def degraded(self) -> bool:
        """True while the state is kept locally because Redis could not be reached."""
        return self._degraded_until is not None

    def keys(self, source: str) -> tuple[str, str]:
        return f"{self._namespace}:{source}:state", f"{self._namespace}:{source}:probe"

    async def aupdate(self, source: str, now: float | None, fn: Update[T]) -> T:
        until = self._degraded_until
        if until is not None and time.monotonic() < until:
            return self._local.update(source, now, fn)
        try:
            async with asyncio.timeout(self._timeout_s * 2):
                result = await self._shared_update(source, fn)
        except (RedisError, OSError, TimeoutError) as exc:
            self._degrade(exc)
            return self._local.update(source, now, fn)
        if until is not None:
            self._restore()
        return result

    def update(self, source: str, now: float | None, fn: Update[T]) -> T:
        """The synchronous API: the same update, run on the breaker's own loop thread."""
        return self._run(self.aupdate(source, now, fn))

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def _shared_update(self, source: str, fn: Update[T]) -> T:
        state_key, lease_key = self.keys(source)
        async with self._client().pipeline() as pipe:
            while True:
                try:
                    await pipe.watch(state_key, lease_key)
                    raw_state = await pipe.hgetall(state_key)
                    old = _decode(raw_state, await pipe.get(lease_key))
                    new, result = fn(old)
                    if new != old:
                        pipe.multi()  # type: ignore[no-untyped-call]
                        self._write(pipe, state_key, lease_key, old, new)
                        await pipe.execute()
                    return result
                except WatchError:
                    continue
                finally:
                    await pipe.reset()  # type: ignore[no-untyped-call]

    def _write(
        self, pipe: Any, state_key: str, lease_key: str, old: Snapshot, new: Snapshot
    ) -> None:
        fields = {"state": new.state, "failures": new.failures, "open_until": repr(new.open_until)}
        pipe.hset(state_key, mapping=fields)
        if new.lease is None and old.lease is not None:
            pipe.delete(lease_key)
        elif new.lease is not None and new.lease != old.lease:
            pipe.set(lease_key, new.lease, nx=True, px=self._lease_ms)

    def _client(self) -> redis.asyncio.Redis:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = redis.asyncio.Redis(
                **self._address,
                socket_timeout=self._timeout_s,
                socket_connect_timeout=self._timeout_s,
            )
            self._clients[loop] = client
        return client

    def _degrade(self, exc: BaseException) -> None:
        first = self._degraded_until is None
        self._degraded_until = time.monotonic() + self._retry_s
        if first:
            detail = f"{type(exc).__name__}: {exc}"[:300]
            logger.warning("breaker: Redis unreachable (%s); using the local breaker state", detail)
            self._report("breaker_degraded", detail)

    def _restore(self) -> None:
        self._degraded_until = None
        logger.warning("breaker: Redis reachable again; using the shared breaker state")
        self._report("breaker_restored", "")

    def _report(self, event_type: str, detail: str) -> None:
        if self._sink is None:
            return
        try:
            data = {"backend": "redis", "namespace": self._namespace, "detail": detail}
            self._sink.emit(BREAKER_EVENT_SOURCE, event_type, data)
        except Exception:
            logger.exception("the event sink failed to record %s", event_type)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run on a fresh loop (this thread's, or a helper thread's if a loop runs here)."""

        async def once() -> T:
            try:
                return await coro
            finally:
                await self.aclose()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(once())
        with ThreadPoolExecutor(1, thread_name_prefix="trm-breaker") as pool:
            return pool.submit(asyncio.run, once()).result()


def _address(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Where `redis_client` connects to, as `redis.asyncio.Redis` keyword arguments."""
    address = {k: kwargs[k] for k in ("db", "username", "password") if kwargs.get(k) is not None}
    if kwargs.get("path"):
        address["unix_socket_path"] = kwargs["path"]
    else:
        address["host"] = kwargs.get("host", "localhost")
        address["port"] = kwargs.get("port", 6379)
    return address


def _decode(raw: dict[Any, Any], lease: Any) -> Snapshot:
    """The snapshot stored in Redis; anything corrupt is a RedisError (so: degrade, not fail)."""
    try:
        fields = {_text(k): _text(v) for k, v in raw.items()}
        state = fields.get("state", "closed")
        if state not in ("closed", "open", "half_open"):
            raise ValueError(f"unknown state {state!r}")
        return Snapshot(
            cast(BreakerState, state),
            int(fields.get("failures", "0")),
            float(fields.get("open_until", "0")),
            None if lease is None else _text(lease),
        )
    except ValueError as exc:  # includes UnicodeDecodeError
        raise RedisError(f"corrupt breaker state in Redis: {exc}") from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
