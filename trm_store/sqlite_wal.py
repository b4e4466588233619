"""SQLite's WAL mode, switched on when a store opens a file: which files, and the switch that
processes opening a new file together can have refused."""

from __future__ import annotations

import sqlite3
import time

__all__ = ["OURS_OR_EMPTY", "use_wal"]

OURS_OR_EMPTY = (
    "SELECT NOT EXISTS (SELECT 1 FROM sqlite_master WHERE name NOT LIKE 'sqlite%')"
    " OR EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'events')"
)
"""WAL is switched on for a trm store or an empty file only: a foreign database keeps its
journal mode until `open_store(..., adopt_database=True)` has made it a trm store."""
_WAL_RETRY_S = 0.002
"""The pause before `use_wal` tries the switch to WAL again."""


def use_wal(cursor: sqlite3.Cursor, timeout_ms: int) -> None:
    """Put the file in WAL mode (kept in the file: a no-op once done), waiting up to the busy
    timeout (`timeout_ms`) for it.

    The switch can be refused at once with SQLITE_BUSY, without SQLite's busy handler, when
    processes open a new file together (tests/store/test_sqlite_first_open.py): it asks for the
    write lock inside a read transaction, where SQLite does not wait for another connection's
    write lock (the two could wait for each other). A refused switch is tried again."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if e.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or left_ms <= 0:
                raise
        # A try may itself wait in the busy handler: no longer than the time left (the backend
        # sets the busy timeout again after the switch).
        cursor.execute(f"PRAGMA busy_timeout={left_ms}")
        time.sleep(_WAL_RETRY_S)
