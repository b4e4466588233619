"""The embedded response cache: one SQLite file, safe for several processes at once.

WAL mode and a busy timeout let processes read while one writes; every write is one short
`BEGIN IMMEDIATE` transaction (upsert, then purge what has expired). Each operation opens its own
connection in a worker thread (`asyncio.to_thread`), so the event loop never blocks on disk and
nothing is shared across threads or a fork. Entries carry an absolute expiry time from the
injectable `clock` (seconds since the epoch, as every process agrees on). The file and its
parent directory are created on first use; until then nothing touches the disk. Storage failures
follow the contract in `trm_llm.cache`: reported, never raised (`trm_llm.stored_cache`).
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
from typing import ClassVar

from trm_llm.errors import LLMConfigError
from trm_llm.protocols import EventSink
from trm_llm.stored_cache import StoredResponseCache

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
_WAL_RETRY_S = 0.002
"""The pause before `_use_wal` tries the switch to WAL again."""


class SqliteResponseCache(StoredResponseCache):
    """A `ResponseCache` in a SQLite file; `namespace` isolates caches sharing one file."""

    backend: ClassVar[str] = "sqlite"
    storage_errors: ClassVar[tuple[type[BaseException], ...]] = (sqlite3.Error, OSError)

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
            raise LLMConfigError(f"busy_timeout_s must be >= 0, got {busy_timeout_s!r}")
        # The busy timeout bounds every operation already; the thread cannot be interrupted.
        super().__init__(ttl_s=ttl_s, namespace=namespace, sink=sink, op_timeout_s=None)
        self._path = Path(path)
        self._clock = clock
        self._busy_timeout_s = busy_timeout_s
        self._schema_ready = False
        self._schema_lock = threading.Lock()

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self._path

    async def _read(self, key: str) -> str | bytes | None:
        return await asyncio.to_thread(self._select, key)

    async def _write(self, key: str, payload: str) -> None:
        await asyncio.to_thread(self._upsert, key, payload)

    def _select(self, key: str) -> str | bytes | None:
        with closing(self._connect()) as conn:
            row = conn.execute(_SELECT, (self._namespace, key, self._clock())).fetchone()
        return None if row is None else row[0]

    def _upsert(self, key: str, payload: str) -> None:
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
                        self._use_wal(conn)
                        conn.executescript(_SCHEMA)
                        self._schema_ready = True
        except BaseException:
            conn.close()
            raise
        return conn

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL (a no-op once it is), waiting up to the busy timeout.

        SQLite refuses the switch at once with SQLITE_BUSY, without its busy handler, while
        another connection holds the write lock on a file not in WAL yet: processes that open a
        new cache together (tests/llm/test_cache_contract.py). So a refused switch is tried again.
        """
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as e:
                if e.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
            time.sleep(_WAL_RETRY_S)
