"""SQLite errors are translated by SQLite's result code (`sqlite_errorcode`), made here by real
conditions: a lock held by another connection, a read-only connection, a full database, a file
that is not a database, a trigger, and constraint failures whose words mislead."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.exc import DBAPIError

from tests.store.helpers import TOTALS, added
from trm_store import ReadOnlyStoreError, Store, StoreError, open_store


@pytest.fixture
def store(sqlite_url: str) -> Iterator[Store]:
    with open_store(sqlite_url, projections=TOTALS) as s:
        s.append("s", [added(1)])
        yield s


def _on_writer(store: Store, pragma: str) -> None:
    """Set a pragma on this thread's writer connection (the one its appends use)."""
    with store.write_transaction() as conn:
        conn.exec_driver_sql(pragma)


def _code(error: BaseException) -> int:
    cause = error.__cause__
    assert isinstance(cause, DBAPIError), error
    code = cause.orig.sqlite_errorcode  # type: ignore[union-attr]
    assert isinstance(code, int)
    return code & 0xFF


def test_a_lock_held_past_the_busy_timeout(store: Store, sqlite_url: str) -> None:
    _on_writer(store, "PRAGMA busy_timeout = 50")
    other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError, match="stayed locked past the busy timeout") as info:
            store.append("s", [added(2)])
        assert type(info.value) is StoreError and _code(info.value) == sqlite3.SQLITE_BUSY
    finally:
        other.close()
    store.append("s", [added(2)])
    assert store.head_position() == 2


def test_a_read_only_connection(store: Store) -> None:
    _on_writer(store, "PRAGMA query_only = ON")
    with pytest.raises(ReadOnlyStoreError, match="is read-only") as info:
        store.append("s", [added(2)])
    assert _code(info.value) == sqlite3.SQLITE_READONLY
    assert store.head_position() == 1


def test_a_full_database(store: Store) -> None:
    with store.write_transaction() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
        conn.exec_driver_sql(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StoreError, match=r"disk full .*nothing was written") as info:
        store.append("s", [added(2, meta={"pad": "x" * 200_000})])
    assert _code(info.value) == sqlite3.SQLITE_FULL
    assert store.head_position() == 1


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "trm.db"
    path.write_bytes(b"not a database, " * 512)
    with pytest.raises(StoreError, match="is corrupt or not a trm store") as info:
        open_store(f"sqlite:///{path}").close()
    assert _code(info.value) == sqlite3.SQLITE_NOTADB


def test_the_log_s_triggers(store: Store) -> None:
    with (
        pytest.raises(StoreError, match="append-only: DELETE refused") as info,
        store.write_transaction() as conn,
    ):
        conn.exec_driver_sql("DELETE FROM events")
    assert _code(info.value) == sqlite3.SQLITE_CONSTRAINT
    assert store.head_position() == 1


@pytest.mark.parametrize(
    ("table", "violation", "message"),
    [
        (  # a CHECK constraint whose name says "locked": not a lock
            "CREATE TABLE doors (state TEXT CONSTRAINT not_locked CHECK (state != 'locked'))",
            "INSERT INTO doors VALUES ('locked')",
            "CHECK constraint failed: not_locked",
        ),
        (  # a NOT NULL column named readonly: not a read-only store
            "CREATE TABLE flags (readonly INTEGER NOT NULL)",
            "INSERT INTO flags VALUES (NULL)",
            "NOT NULL constraint failed: flags.readonly",
        ),
        (  # a unique column named "busy": not a busy database
            "CREATE TABLE rooms (busy TEXT UNIQUE)",
            "INSERT INTO rooms VALUES ('x'), ('x')",
            "UNIQUE constraint failed: rooms.busy",
        ),
    ],
)
def test_the_words_of_a_message_decide_nothing(
    store: Store, table: str, violation: str, message: str
) -> None:
    with store.write_transaction() as conn:
        conn.exec_driver_sql(table)
    with pytest.raises(StoreError) as info, store.write_transaction() as conn:
        conn.exec_driver_sql(violation)
    assert type(info.value) is StoreError
    assert str(info.value).startswith(f"database error on {store.url}: {message}")
    assert _code(info.value) == sqlite3.SQLITE_CONSTRAINT
