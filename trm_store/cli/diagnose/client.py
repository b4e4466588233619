"""The governed client `trm diagnose` asks through, built from `LLMSettings` (env / `.env`).

Cache (SQLite or Redis, or none), circuit breaker (local, or shared through Redis), retries and
timeouts as the settings say, every event to `sink`; closed with everything it opened.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import redis
import redis.asyncio

from trm_llm import (
    CircuitBreaker,
    EventSink,
    GovernedLLMClient,
    LLMSettings,
    RedisResponseCache,
    RetryPolicy,
    SqliteResponseCache,
)
from trm_llm.cache import ResponseCache

__all__ = ["governed_client"]


@asynccontextmanager
async def governed_client(
    settings: LLMSettings, sink: EventSink | None
) -> AsyncIterator[GovernedLLMClient]:
    """The client `settings` describe (cache, breaker, retries), closed with what it opened."""
    async with AsyncExitStack() as stack:
        cache: ResponseCache | None = None
        ttl, namespace = settings.redis_cache_ttl, settings.llm_cache_namespace
        if settings.llm_cache_backend == "sqlite":
            path = settings.llm_cache_sqlite_path
            cache = SqliteResponseCache(path, ttl_s=ttl, namespace=namespace, sink=sink)
        elif settings.llm_cache_backend == "redis":
            async_redis = redis.asyncio.Redis.from_url(str(settings.redis_url))
            stack.push_async_callback(async_redis.aclose)
            cache = RedisResponseCache(async_redis, ttl_s=ttl, namespace=namespace, sink=sink)
        shared = None
        if settings.llm_breaker_shared:
            shared = redis.Redis.from_url(str(settings.redis_url))
            stack.callback(shared.close)
        breaker = CircuitBreaker(
            settings.llm_breaker_fail_threshold,
            settings.llm_breaker_cooldown_s,
            settings.llm_breaker_probe_timeout_s,
            redis_client=shared,
        )
        retry = RetryPolicy(
            max_attempts=settings.llm_max_attempts,
            base_delay_s=settings.llm_base_delay_s,
            max_delay_s=settings.llm_max_delay_s,
            deadline_s=settings.llm_deadline_s,
            retry_after_cap_s=settings.llm_retry_after_cap_s,
        )
        client = GovernedLLMClient(
            settings.llm_base_url,
            settings.llm_model,
            api_key=settings.llm_api_key,
            cache=cache,
            breaker=breaker,
            retry=retry,
            sink=sink,
            profile=settings.llm_profile,
            source=settings.llm_source,
            cache_length=settings.llm_cache_length,
            first_token_timeout_s=settings.llm_first_token_timeout_s,
            inter_token_timeout_s=settings.llm_inter_token_timeout_s,
        )
        stack.push_async_callback(client.aclose)
        yield client
