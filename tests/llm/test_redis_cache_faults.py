"""Issue 15.3 (the response cache): a stopped or down Redis costs a call a bounded time, the call
still answers (uncached), the trouble is said (event + warning), and caching resumes by itself.

Each test runs its own `redis-server` on a free port and freezes (SIGSTOP) or kills only that
one. The cache is built on a plain `Redis(host, port)`, without socket timeouts, as `trm
diagnose` builds it: before the fix, a frozen Redis hung such a call forever (the outer
`wait_for` turns that into a failure).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from trm_llm import GovernedLLMClient, LLMSettings, RedisResponseCache, RetryPolicy
from trm_llm.simulated_server import SimulatedServer, normal

from .conftest import ListSink
from .private_redis import PrivateRedis

GUARD_S = 30.0


@pytest.fixture
async def llm() -> AsyncIterator[SimulatedServer]:
    async with SimulatedServer() as srv:
        srv.default = normal(["full", " answer"])
        yield srv


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def _timed(call: object) -> tuple[object, float]:
    started = time.monotonic()
    result = await asyncio.wait_for(call, GUARD_S)  # type: ignore[arg-type]
    return result, time.monotonic() - started


def _problems(sink: ListSink) -> list[tuple[str, str]]:
    return [(kind, data["error"]) for _, kind, data in sink.events if kind.startswith("cache_")]


async def test_a_frozen_redis_degrades_within_bounds_and_recovers(
    private_redis: PrivateRedis,
    llm: SimulatedServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trm_llm.cache")
    sink = ListSink()
    plain = Redis(host="127.0.0.1", port=private_redis.port)  # no timeouts of its own
    cache = RedisResponseCache(plain, ttl_s=600, namespace="frozen:llm", sink=sink)
    retry = RetryPolicy(deadline_s=3.0)
    try:
        async with GovernedLLMClient(
            llm.base_url, "sim", cache=cache, sink=sink, retry=retry
        ) as client:
            assert not (await client.chat(_ask("a"))).cached
            assert (await client.chat(_ask("a"))).cached

            private_redis.freeze()
            try:
                answer, elapsed = await _timed(client.chat(_ask("b")))
                hit_while_frozen, _ = await _timed(client.chat(_ask("a")))
            finally:
                private_redis.thaw()
            assert answer.content == "full answer" and not answer.cached  # type: ignore[attr-defined]
            assert not hit_while_frozen.cached  # type: ignore[attr-defined]
            # Two bounded operations (read, write), each at most the default 1 s.
            assert elapsed < 2 * 1.0 + 1.0

            after = [await client.chat(_ask(q)) for q in ("c", "c")]
            assert [r.cached for r in after] == [False, True]
    finally:
        await plain.aclose()
    frozen = _problems(sink)[:3]
    assert frozen == [
        ("cache_read_failed", "TimeoutError"),
        ("cache_write_failed", "TimeoutError"),
        ("cache_read_failed", "TimeoutError"),
    ]
    warnings = [r.getMessage() for r in caplog.records if r.name == "trm_llm.cache"]
    assert any(w.startswith("cache_read_failed") and "TimeoutError" in w for w in warnings)
    completed = sink.of("call_completed")
    assert [c["cache"] for c in completed] == ["miss", "hit", "miss", "miss", "miss", "hit"]


async def test_a_down_redis_degrades_within_bounds_and_recovers(
    private_redis: PrivateRedis, llm: SimulatedServer
) -> None:
    sink = ListSink()
    settings = LLMSettings(
        llm_base_url=llm.base_url,
        llm_model="sim",
        llm_cache_backend="redis",
        redis_url=private_redis.url,
        llm_cache_namespace="down:llm",
    )
    cache = RedisResponseCache.from_settings(settings, sink=sink)
    try:
        async with GovernedLLMClient(
            llm.base_url, "sim", cache=cache, sink=sink, retry=RetryPolicy(deadline_s=3.0)
        ) as client:
            assert not (await client.chat(_ask("a"))).cached
            private_redis.kill()  # the port now refuses connections
            answers = [await _timed(client.chat(_ask(q))) for q in ("a", "b")]
            assert all(a.content == "full answer" for a, _ in answers)  # type: ignore[attr-defined]
            assert all(elapsed < 3.0 for _, elapsed in answers)
            private_redis.start()  # the same port, empty
            after = [await client.chat(_ask(q)) for q in ("b", "b")]
            assert [r.cached for r in after] == [False, True]
    finally:
        await cache.aclose()
    kinds = [kind for kind, _ in _problems(sink)]
    assert kinds == ["cache_read_failed", "cache_write_failed"] * 2


def test_from_url_sets_socket_timeouts_and_no_retries() -> None:
    cache = RedisResponseCache.from_url("redis://127.0.0.1:1/0", ttl_s=60, timeout_s=0.5)
    kwargs = cache._redis.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.5, 0.5)
    assert cache._redis.get_retry().get_retries() == 0  # type: ignore[union-attr]
