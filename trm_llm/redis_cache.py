"""The Redis response cache: `namespace:digest` keys, every entry written with `SET .. EX ttl`.

Shared by every process that points at the same Redis. Every command is bounded in time twice:
by the client's socket timeouts (`from_url` sets them) and by `op_timeout_s` around the command,
which also holds for a client built without timeouts. So a stopped Redis (SIGSTOP: connections
are accepted, nothing is answered) or a down one costs a call at most `op_timeout_s` per cache
operation: the read is a miss, the write returns False, each reported to the sink and the log
as `cache_read_failed` / `cache_write_failed` (see `trm_llm.cache`), and caching resumes by
itself when Redis answers again.
"""

from __future__ import annotations

from typing import ClassVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from trm_llm.cache import check_key
from trm_llm.errors import LLMConfigError
from trm_llm.protocols import EventSink
from trm_llm.settings import LLMSettings
from trm_llm.stored_cache import StoredResponseCache

__all__ = ["DEFAULT_REDIS_TIMEOUT_S", "RedisResponseCache"]

DEFAULT_REDIS_TIMEOUT_S = 1.0
"""The default bound (seconds) of one Redis cache operation, and of its socket reads/connects."""


class RedisResponseCache(StoredResponseCache):
    """A `ResponseCache` on a `redis.asyncio.Redis` client (the caller's, unless `from_url`)."""

    backend: ClassVar[str] = "redis"
    storage_errors: ClassVar[tuple[type[BaseException], ...]] = (RedisError, OSError)

    def __init__(
        self,
        redis: Redis,
        *,
        ttl_s: int,
        namespace: str = "trm:llm",
        sink: EventSink | None = None,
        op_timeout_s: float | None = DEFAULT_REDIS_TIMEOUT_S,
    ) -> None:
        super().__init__(ttl_s=ttl_s, namespace=namespace, sink=sink, op_timeout_s=op_timeout_s)
        self._redis = redis
        self._owns_redis = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        ttl_s: int,
        namespace: str = "trm:llm",
        sink: EventSink | None = None,
        timeout_s: float = DEFAULT_REDIS_TIMEOUT_S,
    ) -> RedisResponseCache:
        """A cache with its own client: socket connect/read timeouts of `timeout_s`, no
        client-side retries (a failed command is one bounded miss), closed by `aclose()`."""
        client = Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        cache = cls(client, ttl_s=ttl_s, namespace=namespace, sink=sink, op_timeout_s=timeout_s)
        cache._owns_redis = True
        return cache

    @classmethod
    def from_settings(
        cls, settings: LLMSettings, *, sink: EventSink | None = None
    ) -> RedisResponseCache:
        """The cache `settings` describe (LLM_CACHE_URL if it is a Redis URL, else REDIS_URL;
        REDIS_CACHE_TTL, LLM_CACHE_NAMESPACE), on its own client with the default timeouts
        (`from_url`)."""
        target = settings.cache_target()
        url = target.url if target.backend == "redis" else settings.redis_url
        if url is None:
            raise LLMConfigError(
                "a Redis response cache needs LLM_CACHE_URL=redis://... or REDIS_URL"
            )
        return cls.from_url(
            str(url),
            ttl_s=settings.redis_cache_ttl,
            namespace=settings.llm_cache_namespace,
            sink=sink,
        )

    async def aclose(self) -> None:
        """Close the Redis client if `from_url` created it."""
        if self._owns_redis:
            await self._redis.aclose()

    def redis_key(self, key: str) -> str:
        """The Redis key name of a cache key: namespace and digest, never prompt text."""
        return f"{self._namespace}:{check_key(key)}"

    async def _read(self, key: str) -> str | bytes | None:
        # `get` has checked the key: it is not checked twice
        raw: str | bytes | None = await self._redis.get(f"{self._namespace}:{key}")
        return raw

    async def _write(self, key: str, payload: str) -> None:
        await self._redis.set(f"{self._namespace}:{key}", payload, ex=self._ttl_s)  # as _read
