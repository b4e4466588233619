"""The Redis response cache: `namespace:digest` keys, every entry written with `SET .. EX ttl`.

Shared by every process that points at the same Redis. A storage failure (Redis down, a timeout,
a refused command) never escapes: a read becomes a miss, a write returns False, and each is
reported to the sink and the log (see `trm_llm.cache`).
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import RedisError

from trm_llm.cache import (
    CachedResponse,
    CacheReporter,
    ResponseCache,
    check_key,
    check_namespace,
    encode_entry,
)
from trm_llm.protocols import EventSink
from trm_llm.settings import resolve_cache_ttl

__all__ = ["RedisResponseCache"]

_STORAGE_ERRORS = (RedisError, OSError)


class RedisResponseCache(ResponseCache):
    """A `ResponseCache` on a `redis.asyncio.Redis` client the caller owns (and closes)."""

    def __init__(
        self,
        redis: Redis,
        *,
        ttl_s: int,
        namespace: str = "trm:llm",
        sink: EventSink | None = None,
    ) -> None:
        self._redis = redis
        self._ttl_s = resolve_cache_ttl(ttl_s)
        self._namespace = check_namespace(namespace)
        self._report = CacheReporter("redis", self._namespace, sink)

    @property
    def ttl_s(self) -> int:
        """Seconds an entry lives after it is written."""
        return self._ttl_s

    @property
    def namespace(self) -> str:
        """The prefix of every key name this cache writes."""
        return self._namespace

    def redis_key(self, key: str) -> str:
        """The Redis key name of a cache key: namespace and digest, never prompt text."""
        return f"{self._namespace}:{check_key(key)}"

    async def get(self, key: str) -> CachedResponse | None:
        """The stored answer, or None (miss, corrupt entry, or Redis unreachable)."""
        name = self.redis_key(key)
        try:
            raw: bytes | str | None = await self._redis.get(name)
        except _STORAGE_ERRORS as exc:
            self._report.read_failed(key, exc)
            return None
        return self._report.decoded(key, raw)

    async def set(self, key: str, value: CachedResponse) -> bool:
        """Write `value` with `SET name value EX ttl`; False (reported) when Redis refused."""
        name = self.redis_key(key)
        payload = encode_entry(value)
        try:
            await self._redis.set(name, payload, ex=self._ttl_s)
        except _STORAGE_ERRORS as exc:
            self._report.write_failed(key, exc)
            return False
        return True
