"""`StoreEventSink`: the client's events land in the event log, valid, and feed `llm_calls`."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from redis.asyncio import Redis

from trm_llm import CircuitBreaker, RedisResponseCache, StoreEventSink
from trm_llm.errors import FatalLLMError
from trm_llm.simulated_server import SimulatedServer, cut, normal, status
from trm_store import Store, open_store
from trm_store.domain.llm_calls import breaker_transitions, cache_problems, llm_calls, llm_stats

from .conftest import USER, ClientFactory, FakeClock


@pytest.mark.postgres
async def test_calls_and_breaker_changes_are_recorded(
    store: Store, server: SimulatedServer, make_client: ClientFactory
) -> None:
    sink = StoreEventSink(store)
    clock = FakeClock(0.0)

    async def wait(seconds: float) -> None:  # the backoff outlasts the cooldown
        clock.now += 10.0

    breaker = CircuitBreaker(fail_threshold=1, cooldown_s=10.0)
    client = make_client(sink=sink, breaker=breaker, clock=clock, sleep=wait)
    server.script(cut(after=2), normal(["ok"]), status(401))
    ok = await client.chat(USER, cache_salt="run:e1")  # truncated, then the probe succeeds
    with pytest.raises(FatalLLMError):
        await client.chat(USER)
    events = store.read_stream("llm:sim")
    assert [e.type for e in events] == [
        "llm.breaker_changed",
        "llm.breaker_changed",
        "llm.breaker_changed",
        "llm.call_completed",
        "llm.call_failed",
    ]
    completed = events[3].data
    assert completed["call_id"] == ok.call_id and completed["cache_salt"] == "run:e1"
    assert [a["reason"] for a in completed["attempts"]] == ["truncated_no_done", None]
    rows = llm_calls(store, source="sim")
    assert [(r["outcome"], r["attempts"], r["tokens_discarded"]) for r in rows] == [
        ("completed", 2, 2),
        ("failed", 1, 0),
    ]
    assert rows[1]["error"] == "fatal" and rows[1]["status"] == 401
    assert [(t["from_state"], t["to_state"]) for t in breaker_transitions(store)] == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]
    assert llm_stats(store)["sim"]["attempt_reasons"] == {"truncated_no_done": 1, "http_401": 1}


@pytest.mark.redis
async def test_cache_events_go_to_the_cache_stream(
    tmp_path: Path, server: SimulatedServer, make_client: ClientFactory
) -> None:
    redis = Redis(host="127.0.0.1", port=6379)
    namespace = f"test:llm:{uuid.uuid4().hex}"
    with open_store(f"sqlite:///{tmp_path / 'trm.db'}") as store:
        sink = StoreEventSink(store)
        cache = RedisResponseCache(redis, ttl_s=600, namespace=namespace, sink=sink)
        client = make_client(sink=sink, cache=cache)
        try:
            await client.chat(USER)
            key = cache.build_key("sim", USER, None, {}, endpoint=server.base_url)
            await redis.set(cache.redis_key(key), b"{not json")
            again = await client.chat(USER)  # corrupt entry: a miss, reported, re-fetched
        finally:
            await redis.delete(cache.redis_key(key))
            await redis.aclose()
        assert again.cached is False and server.request_count == 2
        assert [e.type for e in store.read_stream("llm:cache")] == ["llm.cache_corrupt"]
        assert [p["cause"] for p in cache_problems(store)] == ["bad_json"]
        assert [r["cache_write"] for r in llm_calls(store)] == ["written", "written"]
