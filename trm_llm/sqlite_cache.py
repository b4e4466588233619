"""The embedded response cache: one SQLite file, safe for several processes at once.

WAL mode and a busy timeout let processes read while one writes; every write is one short
`BEGIN IMMEDIATE` transaction (upsert, then purge what has expired). Each operation opens its own
connection in a worker thread (`asyncio.to_thread`), so the event loop never blocks on disk and
nothing is shared across threads or a fork. Entries carry an absolute expiry time from the
injectable `clock` (seconds since the epoch, as every process agrees on). The file and its
parent directory are created on first use; until then nothing touches the disk. Storage failures
follow the contract in `trm_llm.cache`: reported, never raised.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

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

__all__ = ["SqliteResponseCache"]

_TABLE = "llm_response_cache"
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {_TABLE} (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {_TABLE}_expiry ON {_TABLE} (expires_at);
"""
_SELECT = f"SELECT value FROM {_TABLE} WHERE namespace = ? AND key = ? AND expires_at > ?"
_UPSERT = (
    f"INSERT INTO {_TABLE} (namespace, key, value, expires_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
    "expires_at = excluded.expires_at"
)
_PURGE = f"DELETE FROM {_TABLE} WHERE expires_at <= ?"
_STORAGE_ERRORS = (sqlite3.Error, OSError)


class SqliteResponseCache(ResponseCache):
    """A `ResponseCache` in a SQLite file; `namespace` isolates caches sharing one file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ttl_s: int,
        namespace: str = "trm:llm",
        sink: EventSink | None = None,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = 5.0,
    ) -> None:
        if not busy_timeout_s >= 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {busy_timeout_s!r}")
        self._path = Path(path)
        self._ttl_s = resolve_cache_ttl(ttl_s)
        self._namespace = check_namespace(namespace)
        self._report = CacheReporter("sqlite", self._namespace, sink)
        self._clock = clock
        self._busy_timeout_s = busy_timeout_s
        self._schema_ready = False
        self._schema_lock = threading.Lock()

    @property
    def ttl_s(self) -> int:
        """Seconds an entry lives after it is written."""
        return self._ttl_s

    @property
    def namespace(self) -> str:
        """The namespace column value of every row this cache reads and writes."""
        return self._namespace

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self._path

    async def get(self, key: str) -> CachedResponse | None:
        """The stored, unexpired answer, or None (miss, corrupt entry, or unreadable file)."""
        check_key(key)
        try:
            raw = await asyncio.to_thread(self._read, key)
        except _STORAGE_ERRORS as exc:
            self._report.read_failed(key, exc)
            return None
        return self._report.decoded(key, raw)

    async def set(self, key: str, value: CachedResponse) -> bool:
        """Store `value` until now + ttl; False (reported) when the file refused the write."""
        check_key(key)
        payload = encode_entry(value)
        try:
            await asyncio.to_thread(self._write, key, payload)
        except _STORAGE_ERRORS as exc:
            self._report.write_failed(key, exc)
            return False
        return True

    def _read(self, key: str) -> str | bytes | None:
        with closing(self._connect()) as conn:
            row = conn.execute(_SELECT, (self._namespace, key, self._clock())).fetchone()
        return None if row is None else row[0]

    def _write(self, key: str, payload: str) -> None:
        now = self._clock()
        with closing(self._connect()) as conn, conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_UPSERT, (self._namespace, key, payload, now + self._ttl_s))
            conn.execute(_PURGE, (now,))

    def _connect(self) -> sqlite3.Connection:
        """A fresh autocommit connection; the first one also creates the file and the schema."""
        if not self._schema_ready:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self._path, timeout=self._busy_timeout_s, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
            if not self._schema_ready:
                with self._schema_lock:
                    if not self._schema_ready:
                        conn.execute("PRAGMA journal_mode=WAL")
                        conn.executescript(_SCHEMA)
                        self._schema_ready = True
        except BaseException:
            conn.close()
            raise
        return conn
