"""`StoredResponseCache`: what the Redis and SQLite response caches share.

A backend only says how to read and write one raw envelope (`_read`, `_write`) and which
exceptions are storage failures; this base checks the key, encodes and decodes the envelope,
bounds every operation in time (`op_timeout_s`, so a stopped server costs at most that long),
and turns every storage failure into a miss or a False plus one event and one warning
(`trm_llm.cache.CacheReporter`). It never raises for a storage failure.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from pydantic_core import PydanticSerializationError

from trm_llm.cache import (
    CachedResponse,
    CacheReporter,
    ResponseCache,
    check_key,
    check_namespace,
    encode_entry,
)
from trm_llm.errors import LLMConfigError
from trm_llm.protocols import EventSink
from trm_llm.settings import resolve_cache_ttl

__all__ = ["StoredResponseCache"]


class StoredResponseCache(ResponseCache):
    """The common half of a storage-backed `ResponseCache` (see the module docstring)."""

    backend: ClassVar[str]
    storage_errors: ClassVar[tuple[type[BaseException], ...]]

    def __init__(
        self,
        *,
        ttl_s: int,
        namespace: str,
        sink: EventSink | None,
        op_timeout_s: float | None,
    ) -> None:
        if op_timeout_s is not None and not op_timeout_s > 0:
            raise LLMConfigError(f"op_timeout_s must be > 0 or None, got {op_timeout_s!r}")
        self._ttl_s = resolve_cache_ttl(ttl_s)
        self._namespace = check_namespace(namespace)
        self._op_timeout_s = op_timeout_s
        self._report = CacheReporter(self.backend, self._namespace, sink)
        self._read_errors: tuple[type[BaseException], ...] = (*self.storage_errors, TimeoutError)
        self._write_errors: tuple[type[BaseException], ...] = (
            *self._read_errors,
            PydanticSerializationError,
        )

    @property
    def ttl_s(self) -> int:
        """Seconds an entry lives after it is written."""
        return self._ttl_s

    @property
    def op_timeout_s(self) -> float | None:
        """The bound (seconds) of one storage operation; None: unbounded."""
        return self._op_timeout_s

    @property
    def namespace(self) -> str:
        """The namespace every entry of this cache is stored under."""
        return self._namespace

    async def get(self, key: str) -> CachedResponse | None:
        """The stored, unexpired answer, or None (miss, corrupt entry, or storage failure)."""
        check_key(key)
        try:
            async with asyncio.timeout(self._op_timeout_s):
                raw = await self._read(key)
        except self._read_errors as exc:
            self._report.read_failed(key, exc)
            return None
        return self._report.decoded(key, raw)

    async def set(self, key: str, value: CachedResponse) -> bool:
        """Store `value` for the TTL; False (reported) when the storage refused the write or the
        value has no JSON form."""
        check_key(key)
        try:
            payload = encode_entry(value)
            async with asyncio.timeout(self._op_timeout_s):
                await self._write(key, payload)
        except self._write_errors as exc:
            self._report.write_failed(key, exc)
            return False
        return True

    async def _read(self, key: str) -> str | bytes | None:
        """The raw envelope stored for `key`, or None."""
        raise NotImplementedError

    async def _write(self, key: str, payload: str) -> None:
        """Store the raw envelope `payload` for `key` with this cache's TTL."""
        raise NotImplementedError
