"""`client_from_settings`: the governed client `LLMSettings` describe, with everything it needs.

One builder for every harness (the demo and `trm diagnose` use it too): the response cache
(SQLite or Redis, from LLM_CACHE_URL or LLM_CACHE_BACKEND), the circuit breaker (local, or
shared through REDIS_URL), the retry policy, the endpoint's concurrency limiter and the stall
timers. Switching the cache to Redis is configuration only (`LLM_CACHE_URL=redis://...`). The
client closes what was built for it (`async with` or `aclose()`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from trm_llm.breaker import CircuitBreaker
from trm_llm.cache import ResponseCache
from trm_llm.client import GovernedLLMClient
from trm_llm.limiter import ConcurrencyLimiter
from trm_llm.protocols import EventSink
from trm_llm.retry import RetryPolicy
from trm_llm.settings import LLMSettings

__all__ = ["client_from_settings"]


def client_from_settings(
    settings: LLMSettings,
    *,
    sink: EventSink | None = None,
    http: httpx.AsyncClient | None = None,
) -> GovernedLLMClient:
    """The client `settings` describe, every event (calls, cache problems, the shared breaker's
    state) to `sink`; `http` for a caller's own HTTP client (left open)."""
    closers: list[Callable[[], Awaitable[None]]] = []
    cache = _cache(settings, sink, closers)
    shared = None
    if settings.llm_breaker_shared:
        import redis  # only the connection settings: the breaker opens its own connections

        shared = redis.Redis.from_url(str(settings.redis_url))
    breaker = CircuitBreaker(
        settings.llm_breaker_fail_threshold,
        settings.llm_breaker_cooldown_s,
        settings.llm_breaker_probe_timeout_s,
        redis_client=shared,
        sink=sink,
    )
    closers.append(breaker.aclose)
    retry = RetryPolicy(
        max_attempts=settings.llm_max_attempts,
        base_delay_s=settings.llm_base_delay_s,
        max_delay_s=settings.llm_max_delay_s,
        deadline_s=settings.llm_deadline_s,
        retry_after_cap_s=settings.llm_retry_after_cap_s,
    )
    limiter = ConcurrencyLimiter(
        settings.llm_concurrency_initial, ceiling=settings.llm_concurrency_ceiling
    )
    return GovernedLLMClient(
        settings.llm_base_url,
        settings.llm_model,
        api_key=settings.llm_api_key,
        cache=cache,
        breaker=breaker,
        retry=retry,
        sink=sink,
        http=http,
        profile=settings.llm_profile,
        source=settings.llm_source,
        limiter=limiter,
        cache_length=settings.llm_cache_length,
        first_token_timeout_s=settings.llm_first_token_timeout_s,
        inter_token_timeout_s=settings.llm_inter_token_timeout_s,
        close_with=closers,
    )


def _cache(
    settings: LLMSettings,
    sink: EventSink | None,
    closers: list[Callable[[], Awaitable[None]]],
) -> ResponseCache | None:
    target = settings.cache_target()
    ttl, namespace = settings.redis_cache_ttl, settings.llm_cache_namespace
    if target.backend == "sqlite" and target.path is not None:
        from trm_llm.sqlite_cache import SqliteResponseCache

        return SqliteResponseCache(target.path, ttl_s=ttl, namespace=namespace, sink=sink)
    if target.backend == "redis":
        from trm_llm.redis_cache import RedisResponseCache

        cache = RedisResponseCache.from_settings(settings, sink=sink)  # with timeouts
        closers.append(cache.aclose)
        return cache
    return None
