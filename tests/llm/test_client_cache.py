"""The client with the real Redis response cache: what it returns and what the cache then holds."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

from trm_llm.cache import CachedResponse
from trm_llm.errors import RetriesExhausted
from trm_llm.protocols import LLMProvider
from trm_llm.redis_cache import RedisResponseCache
from trm_llm.simulated_server import SimulatedServer, cut, error_payload, normal, reset
from trm_llm.vision import VisionLLMClient

from .conftest import USER, ClientFactory, ListSink

pytestmark = pytest.mark.redis


@pytest.fixture
async def redis_client() -> AsyncIterator[Redis]:
    client = Redis(host="127.0.0.1", port=6379)
    yield client
    await client.aclose()


@pytest.fixture
async def cache(redis_client: Redis) -> AsyncIterator[RedisResponseCache]:
    namespace = f"test:llm:{uuid.uuid4().hex}"
    yield RedisResponseCache(redis_client, ttl_s=600, namespace=namespace)
    keys = [k async for k in redis_client.scan_iter(match=f"{namespace}:*")]
    if keys:
        await redis_client.delete(*keys)


async def stored_keys(redis_client: Redis, cache: RedisResponseCache) -> list[bytes]:
    return [k async for k in redis_client.scan_iter(match=f"{cache.namespace}:*")]


def key_of(
    cache: RedisResponseCache,
    server: SimulatedServer,
    salt: str | None = None,
    messages: Sequence[Mapping[str, Any]] = USER,
    **params: object,
) -> str:
    return cache.build_key("sim", messages, salt, params, endpoint=server.base_url)


async def test_miss_writes_then_hit_returns_without_a_request(
    server: SimulatedServer,
    make_client: ClientFactory,
    sink: ListSink,
    cache: RedisResponseCache,
    redis_client: Redis,
) -> None:
    client = make_client(cache=cache)
    first = await client.chat(USER, temperature=0)
    second = await client.chat(USER, temperature=0)
    assert (first.cached, second.cached, second.attempts) == (False, True, 0)
    assert second.content == first.content == "Hello, world"
    assert second.usage == first.usage and server.request_count == 1
    key = key_of(cache, server, temperature=0)
    assert await stored_keys(redis_client, cache) == [cache.redis_key(key).encode()]
    assert await cache.get(key) == CachedResponse(
        content="Hello, world", reasoning=None, finish_reason="stop", usage=first.usage, model="sim"
    )
    assert 0 < await redis_client.ttl(cache.redis_key(key)) <= 600
    done = sink.of("call_completed")
    assert [(e["cache"], e["cache_write"]) for e in done] == [("miss", "written"), ("hit", None)]
    assert done[1]["attempts"] == []


@pytest.mark.parametrize(
    "fault",
    [cut(after=3), reset(after=3), error_payload("error")],
    ids=["truncated", "reset", "error_payload"],
)
async def test_a_bad_stream_is_never_cached(
    server: SimulatedServer,
    make_client: ClientFactory,
    cache: RedisResponseCache,
    fault: object,
) -> None:
    # Plan task 3's "no cache write": only the complete retry is stored.
    server.script(fault, normal(["complete"]))  # type: ignore[arg-type]
    result = await make_client(cache=cache).chat(USER)
    assert (result.content, result.attempts) == ("complete", 2)
    stored = await cache.get(key_of(cache, server))
    assert stored is not None and stored.content == "complete"


async def test_all_attempts_truncated_leave_the_cache_empty(
    server: SimulatedServer,
    make_client: ClientFactory,
    cache: RedisResponseCache,
    redis_client: Redis,
) -> None:
    server.script(*[cut()] * 4)
    with pytest.raises(RetriesExhausted):
        await make_client(cache=cache).chat(USER)
    assert await stored_keys(redis_client, cache) == []


async def test_length_is_not_cached_unless_asked(
    server: SimulatedServer,
    make_client: ClientFactory,
    sink: ListSink,
    cache: RedisResponseCache,
) -> None:
    server.script(normal(["cut"], finish="length"), normal(["cut"], finish="length"))
    result = await make_client(cache=cache).chat(USER)
    assert result.finish_reason == "length"
    assert await cache.get(key_of(cache, server)) is None
    assert sink.of("call_completed")[0]["cache_write"] == "skipped"
    await make_client(cache=cache, cache_length=True).chat(USER)
    stored = await cache.get(key_of(cache, server))
    assert stored is not None and stored.finish_reason == "length"


async def test_salt_separates_epochs_and_keeps_a_resumed_epoch(
    server: SimulatedServer,
    make_client: ClientFactory,
    sink: ListSink,
    cache: RedisResponseCache,
    redis_client: Redis,
) -> None:
    # Plan task 1 end to end: a new salt re-samples, the same salt hits, None is its own key.
    client = make_client(cache=cache)
    e1 = await client.chat(USER, cache_salt="run:e1")
    e2 = await client.chat(USER, cache_salt="run:e2")
    e1_again = await client.chat(USER, cache_salt="run:e1")
    unsalted = await client.chat(USER)
    assert [r.cached for r in (e1, e2, e1_again, unsalted)] == [False, False, True, False]
    assert server.request_count == 3
    assert len(await stored_keys(redis_client, cache)) == 3
    assert [e["cache_salt"] for e in sink.of("call_completed")] == [
        "run:e1",
        "run:e2",
        "run:e1",
        None,
    ]


async def test_vision_wrapper_forwards_the_salt(
    server: SimulatedServer,
    make_client: ClientFactory,
    cache: RedisResponseCache,
) -> None:
    vision = VisionLLMClient(make_client(cache=cache), detail="low")
    assert isinstance(vision, LLMProvider)
    png = b"\x89PNG fake"
    first = await vision.ask("What is this?", [png], cache_salt="run:e1")
    again = await vision.ask("What is this?", [png], cache_salt="run:e1")
    other_epoch = await vision.ask("What is this?", [png], cache_salt="run:e2")
    assert [r.cached for r in (first, again, other_epoch)] == [False, True, False]
    assert server.request_count == 2
    parts = server.requests[0].body["messages"][0]["content"]
    assert parts[1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,iVBORyBmYWtl", "detail": "low"},
    }
    # chat() forwards too (the path harness code uses).
    via_chat = await vision.chat(server.requests[0].body["messages"], cache_salt="run:e2")
    assert via_chat.cached is True
