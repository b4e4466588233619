"""The API key reaches the server and nowhere else: events, logs, exceptions, cache keys/values."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr
from redis.asyncio import Redis

from trm_llm.errors import FatalLLMError, LLMError, RetriesExhausted
from trm_llm.redis_cache import RedisResponseCache
from trm_llm.retry import RetryPolicy
from trm_llm.simulated_server import SimulatedServer, cut, normal, status

from .conftest import USER, ClientFactory, ListSink

KEY = "sk-test-" + uuid.uuid4().hex


def chain(exc: BaseException) -> str:
    """Every message and repr along the exception's cause/context chain."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen), repr(getattr(seen, "last_error", None))]
        seen = seen.__cause__ or seen.__context__
    return " ".join(parts)


@pytest.fixture
async def redis_client() -> AsyncIterator[Redis]:
    client = Redis(host="127.0.0.1", port=6379)
    yield client
    await client.aclose()


@pytest.mark.redis
@pytest.mark.parametrize("api_key", [KEY, SecretStr(KEY)], ids=["str", "SecretStr"])
async def test_api_key_never_leaves_the_authorization_header(
    server: SimulatedServer,
    make_client: ClientFactory,
    sink: ListSink,
    redis_client: Redis,
    caplog: pytest.LogCaptureFixture,
    api_key: str | SecretStr,
) -> None:
    namespace = f"test:llm:{uuid.uuid4().hex}"
    cache = RedisResponseCache(redis_client, ttl_s=600, namespace=namespace, sink=sink)
    client = make_client(api_key=api_key, cache=cache, retry=RetryPolicy(max_attempts=2))
    echo = {"error": {"message": f"Incorrect API key provided: {KEY}", "code": "invalid_api_key"}}
    server.script(cut(), normal(), status(401, echo), status(500, echo), status(503, echo))
    caplog.set_level(logging.DEBUG)
    texts = [repr(client)]
    try:
        assert (await client.chat(USER)).attempts == 2  # a retried success
        assert (await client.chat(USER)).cached is True
        for _ in range(2):  # a fatal echo, then an exhausted retry echo
            with pytest.raises(LLMError) as info:
                await client.chat(USER, temperature=1)
            assert isinstance(info.value, FatalLLMError | RetriesExhausted)
            texts.append(chain(info.value))
        keys = [k async for k in redis_client.scan_iter(match=f"{namespace}:*")]
        texts += [k.decode() for k in keys]
        texts += [str(await redis_client.get(k)) for k in keys]
    finally:
        keys = [k async for k in redis_client.scan_iter(match=f"{namespace}:*")]
        if keys:
            await redis_client.delete(*keys)
    texts += [json.dumps(e) for e in sink.events]
    texts += [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    assert server.request_count == 5
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    assert len(sink.of("call_completed")) == 2 and len(sink.of("call_failed")) == 2
    assert "Incorrect API key provided: ***" in sink.of("call_failed")[0]["detail"]
    leaks = [t for t in texts if KEY in t]
    assert leaks == []
