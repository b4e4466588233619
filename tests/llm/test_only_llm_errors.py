"""Issue 15.5: `chat()` raises only `LLMError` subclasses (and CancelledError), whatever the
server, the cache or the storage does, and a complete answer is never lost to the cache.

Before the fix: a `Content-Encoding: gzip`/`deflate` header on a plain body gave
`httpx.DecodingError`; an emoji streamed as two JSON-escaped UTF-16 halves, or usage nested
400 deep, with a cache configured, gave `PydanticSerializationError` and lost the answer; a
corrupt cache entry of deeply nested JSON gave `RecursionError` on both backends.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from trm_llm import (
    CachedResponse,
    FatalLLMError,
    RedisResponseCache,
    ResponseCache,
    RetryPolicy,
    SqliteResponseCache,
)
from trm_llm.simulated_server import SSE_HEADERS, Reply, SimulatedServer, normal, sse

from .conftest import USER, ClientFactory, ListSink

EMOJI_HALVES = (
    b'data: {"choices":[{"index":0,"delta":{"content":"smile \\ud83d"},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"\\ude00!"},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def _deep_usage(depth: int) -> Reply:
    usage: Any = 1
    for _ in range(depth):
        usage = {"d": usage}
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
    head = {"choices": [{"index": 0, "delta": {"content": "deep"}, "finish_reason": None}]}
    return Reply(steps=(sse(head), sse(last), sse("[DONE]")))


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def cache(
    request: pytest.FixtureRequest, tmp_path: Path, sink: ListSink
) -> AsyncIterator[SqliteResponseCache | RedisResponseCache]:
    """A cache on each backend (Redis under a namespace of its own, emptied afterwards)."""
    if request.param == "sqlite":
        yield SqliteResponseCache(tmp_path / "c.db", ttl_s=60, sink=sink)
        return
    client = Redis(host="127.0.0.1", port=6379)
    namespace = f"test:only-llm:{uuid.uuid4().hex}"
    yield RedisResponseCache(client, ttl_s=60, namespace=namespace, sink=sink)
    names = [n async for n in client.scan_iter(match=f"{namespace}:*")]
    if names:
        await client.delete(*names)
    await client.aclose()


async def _store_raw(cache: SqliteResponseCache | RedisResponseCache, key: str, raw: str) -> None:
    """Put `raw` where the entry of `key` lives, as another writer (or a bug) would."""
    if isinstance(cache, RedisResponseCache):
        await cache._redis.set(cache.redis_key(key), raw)
        return
    assert await cache.set(key, CachedResponse(content="x", finish_reason="stop", model="m"))
    with sqlite3.connect(cache.path) as conn:
        conn.execute("UPDATE llm_response_cache SET value = ?", (raw,))


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_content_encoding_on_a_plain_body_is_a_fatal_llm_error(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink, encoding: str
) -> None:
    headers = (*SSE_HEADERS, ("Content-Encoding", encoding))
    server.script(Reply(headers=headers, steps=normal().steps))
    client = make_client(retry=RetryPolicy(max_attempts=2))
    with pytest.raises(FatalLLMError) as info:
        await client.chat(USER)
    assert "DecodingError" in str(info.value)
    [failed] = sink.of("call_failed")
    assert (failed["error"], failed["reason"]) == ("fatal", "DecodingError")


@pytest.mark.parametrize("reply", ["emoji_halves", "usage_400_deep"])
async def test_a_hostile_complete_answer_is_returned_and_cached(
    server: SimulatedServer,
    make_client: ClientFactory,
    sink: ListSink,
    cache: ResponseCache,
    reply: str,
) -> None:
    server.script(Reply(steps=(EMOJI_HALVES,)) if reply == "emoji_halves" else _deep_usage(400))
    client = make_client(cache=cache)
    first = await client.chat(USER)
    again = await client.chat(USER)
    expected = "smile \U0001f600!" if reply == "emoji_halves" else "deep"
    assert (first.content, first.cached) == (expected, False)
    assert (again.content, again.cached) == (expected, True)
    assert [c["cache_write"] for c in sink.of("call_completed")] == ["written", None]


DEEP = "[" * 100_000 + "]" * 100_000
CORRUPT = [DEEP, '{"v":1,"response":' + DEEP + "}", '{"v":1,"response":{"content":' + DEEP + "}}"]


@pytest.mark.parametrize("raw", CORRUPT, ids=["bare", "as_response", "as_content"])
async def test_a_deeply_nested_corrupt_entry_is_a_miss(
    make_client: ClientFactory,
    sink: ListSink,
    cache: SqliteResponseCache | RedisResponseCache,
    raw: str,
) -> None:
    client = make_client(cache=cache)
    await _store_raw(cache, cache.build_key("sim", USER, endpoint=client.base_url), raw)
    answer = await client.chat(USER)
    assert (answer.content, answer.cached) == ("Hello, world", False)
    [corrupt] = sink.of("cache_corrupt")
    assert corrupt["reason"] in {"bad_json", "wrong_shape"}


class BrokenCache(ResponseCache):
    """A third-party cache that breaks its contract (it raises)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def get(self, key: str) -> CachedResponse | None:
        raise self.error

    async def set(self, key: str, value: CachedResponse) -> bool:
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyError("k"), TimeoutError()])
async def test_a_cache_that_raises_is_a_fatal_llm_error_with_its_event(
    make_client: ClientFactory, sink: ListSink, error: Exception
) -> None:
    client = make_client(cache=BrokenCache(error))
    with pytest.raises(FatalLLMError) as info:
        await client.chat(USER)
    assert info.value.__cause__ is error
    [failed] = sink.of("call_failed")
    assert (failed["error"], failed["reason"]) == ("unexpected", type(error).__name__)


async def test_params_httpx_cannot_send_are_a_fatal_llm_error(
    make_client: ClientFactory, sink: ListSink
) -> None:
    client = make_client()
    with pytest.raises(FatalLLMError):
        await client.chat(USER, tools=object())
    assert len(sink.of("call_failed")) == 1
