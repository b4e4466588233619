"""Read-only means read-only on both backends, whatever SQL the caller sends (issue 14 point 4).

A hostile caller holding the connection of `store.query()` on a store opened read_only=True
changes session settings, ends the transaction, starts its own, and then writes. Nothing may
persist: not in that transaction, not on the pooled connection the next query gets, and every
error trm raises is typed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, inspect, text

from tests.store.helpers import TOTALS, added
from trm_store import ReadOnlyStoreError, Store, StoreError, open_store

WRITES = [
    "UPDATE test_totals SET total = total + 1000",
    "INSERT INTO test_totals VALUES ('evil', 1, 1, 1)",
    "DELETE FROM test_totals",
    "DELETE FROM projection_state",
    "CREATE TABLE evil (x INTEGER)",
    "DROP TABLE test_totals",
]

PG_ATTACKS: dict[str, list[str]] = {
    "session default off": ["SET default_transaction_read_only = off"],
    "session characteristics": ["SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE"],
    "reset the default": ["RESET default_transaction_read_only"],
    "reset all": ["RESET ALL"],
    "set_config": ["SELECT set_config('default_transaction_read_only', 'off', false)"],
    "transaction read write": ["SET TRANSACTION READ WRITE"],
    "transaction_read_only off": ["SET transaction_read_only = off"],
    "savepoint then read write": ["SAVEPOINT s", "SET TRANSACTION READ WRITE"],
    "discard all": ["DISCARD ALL"],
    "commit, begin read write": ["COMMIT", "BEGIN READ WRITE"],
    "end, start transaction": ["END", "START TRANSACTION READ WRITE"],
    "rollback, session read write": [
        "ROLLBACK",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
    ],
    "commit, default off, commit": [
        "COMMIT",
        "SET default_transaction_read_only = off",
        "COMMIT",
    ],
    "commit and chain, read write": ["COMMIT AND CHAIN", "SET TRANSACTION READ WRITE"],
    "rollback and chain, read write": ["ROLLBACK AND CHAIN", "SET TRANSACTION READ WRITE"],
    "one string": ["COMMIT; BEGIN READ WRITE; UPDATE test_totals SET total = 7; COMMIT"],
    "one string, chained": [
        "COMMIT AND CHAIN; SET TRANSACTION READ WRITE; DELETE FROM test_totals; COMMIT"
    ],
    "a DO block": [
        "ROLLBACK AND CHAIN",
        "DO $$ BEGIN SET TRANSACTION READ WRITE; DELETE FROM test_totals; END $$",
    ],
}

SESSION_SETTINGS = {
    "session default off": "SET default_transaction_read_only = off",
    "session characteristics": "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
    "reset the default": "RESET default_transaction_read_only",
    "reset all": "RESET ALL",
    "set_config": "SELECT set_config('default_transaction_read_only', 'off', false)",
}

REFUSED_BY_POSTGRESQL = {
    "one string": "several statements in one string are not one prepared statement",
    "one string, chained": "several statements in one string are not one prepared statement",
    "transaction read write": "read-write mode must be set before any query",
    "transaction_read_only off": "read-write mode must be set before any query",
    "savepoint then read write": "not inside a read-only transaction",
    "discard all": "DISCARD ALL cannot run inside a transaction block",
    "a DO block": "read-write mode must be set before any query",
    "rollback and chain, read write": "read-write mode must be set before any query",
}
"""Attacks PostgreSQL refuses itself (a plain StoreError naming its reason); trm refuses the
others with ReadOnlyStoreError."""

SQLITE_ATTACKS: dict[str, list[str]] = {
    "query_only off": ["PRAGMA query_only = OFF"],
    "commit, begin immediate": ["COMMIT", "BEGIN IMMEDIATE"],
    "one string": ["COMMIT; BEGIN IMMEDIATE; DELETE FROM test_totals; COMMIT"],
    "journal mode": ["PRAGMA journal_mode = DELETE"],
}


def _snapshot(url: str) -> object:
    """What persists: the SQLite file's bytes and its WAL's (a missing WAL is an empty one: a
    reader may create it), or every row of every table."""
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        wal = Path(f"{path}-wal")
        return [
            hashlib.sha256(p.read_bytes() if p.exists() else b"").hexdigest() for p in (path, wal)
        ]
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                name: sorted(repr(tuple(r)) for r in conn.execute(text(f'SELECT * FROM "{name}"')))
                for name in sorted(inspect(conn).get_table_names())
            }
    finally:
        engine.dispose()


def _seed(url: str) -> None:
    with open_store(url, projections=TOTALS) as store:
        store.append("a", [added(1), added(2)])


def _send(ro: Store, statements: Sequence[str]) -> None:
    """Send `statements` one by one through `store.query()`'s connection, carrying on after
    every error, as a hostile caller would."""
    with suppress(StoreError), ro.query("test_totals") as (conn, _tables):
        for sql in statements:
            with suppress(Exception):
                conn.exec_driver_sql(sql)


def _hostile(ro: Store, statements: Sequence[str]) -> None:
    """`statements`, then every write on the same connection."""
    _send(ro, [*statements, *WRITES, "COMMIT"])


def _every_write_refused(ro: Store) -> None:
    """A later query (the pool's same connection) still refuses every write, typed."""
    for sql in WRITES:
        with pytest.raises(ReadOnlyStoreError), ro.query("test_totals") as (conn, _tables):
            conn.exec_driver_sql(sql)


def _no_trick_writes(url: str, statements: Sequence[str]) -> None:
    _seed(url)
    before = _snapshot(url)
    with open_store(url, read_only=True, projections=TOTALS) as ro:
        _hostile(ro, statements)
        _every_write_refused(ro)
        _hostile(ro, statements)
        assert ro.head_position() == 2
    assert _snapshot(url) == before


@pytest.mark.parametrize("attack", sorted(PG_ATTACKS), ids=lambda name: name)
def test_no_session_trick_lets_a_read_only_postgresql_store_write(pg_url: str, attack: str) -> None:
    _no_trick_writes(pg_url, PG_ATTACKS[attack])


@pytest.mark.parametrize("attack", sorted(SQLITE_ATTACKS), ids=lambda name: name)
def test_no_session_trick_lets_a_read_only_sqlite_store_write(sqlite_url: str, attack: str) -> None:
    _no_trick_writes(sqlite_url, SQLITE_ATTACKS[attack])


@pytest.mark.parametrize("setting", sorted(SESSION_SETTINGS), ids=lambda name: name)
def test_a_session_setting_made_in_one_query_does_not_reach_the_next(
    pg_url: str, setting: str
) -> None:
    """The issue's case: the setting's block ends normally, the pooled connection serves the
    next query, whose UPDATE must be refused."""
    _seed(pg_url)
    before = _snapshot(pg_url)
    with open_store(pg_url, read_only=True, projections=TOTALS) as ro:
        with ro.query("test_totals") as (conn, _tables):
            conn.exec_driver_sql(SESSION_SETTINGS[setting])
        _every_write_refused(ro)
    assert _snapshot(pg_url) == before


@pytest.mark.parametrize("attack", sorted(PG_ATTACKS), ids=lambda name: name)
def test_the_write_after_an_attack_fails_with_a_typed_error(pg_url: str, attack: str) -> None:
    """Without the caller swallowing errors: what leaves `query()` is a StoreError, and a
    ReadOnlyStoreError unless PostgreSQL refused the SQL itself (`REFUSED_BY_POSTGRESQL`)."""
    _seed(pg_url)
    before = _snapshot(pg_url)
    statements = PG_ATTACKS[attack]
    with open_store(pg_url, read_only=True, projections=TOTALS) as ro:
        with pytest.raises(StoreError) as info, ro.query("test_totals") as (conn, _tables):
            for sql in [*statements, "UPDATE test_totals SET total = 0", "COMMIT"]:
                conn.exec_driver_sql(sql)
        if attack not in REFUSED_BY_POSTGRESQL:
            assert isinstance(info.value, ReadOnlyStoreError), info.value
    assert _snapshot(pg_url) == before


def test_a_session_advisory_lock_taken_by_a_reader_is_released_with_its_connection(
    pg_url: str,
) -> None:
    """A pooled reader connection must not keep a lock that would stall every writer."""
    _seed(pg_url)
    with open_store(pg_url, read_only=True, projections=TOTALS) as ro:
        with ro.query("test_totals") as (conn, _tables):
            conn.exec_driver_sql("SELECT pg_advisory_lock(7631213)")
        with open_store(pg_url, projections=TOTALS) as writer, writer.write_transaction() as w:
            assert w.exec_driver_sql("SELECT pg_try_advisory_lock(7631213)").scalar_one()


def test_rebuild_replay_and_verify_on_a_read_only_store_write_nothing(store_url: str) -> None:
    """Even with a projection to rebuild and one behind the log."""
    _seed(store_url)
    with open_store(store_url, projections={}) as bare:
        bare.append("a", [added(3)])  # test_totals is now behind the log
    before = _snapshot(store_url)
    with open_store(store_url, read_only=True, projections=TOTALS) as ro:
        for attempt in (
            ro.recover,
            ro.rebuild_projections,
            lambda: ro.rebuild_projections("test_totals"),
            ro.verify_projections,
        ):
            with pytest.raises(ReadOnlyStoreError):
                attempt()
    assert _snapshot(store_url) == before


PG_POOL = [
    *{sql for attack in PG_ATTACKS.values() for sql in attack},
    *WRITES,
    "COMMIT",
    "ROLLBACK",
    "BEGIN",
]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sessions=st.lists(
        st.lists(st.sampled_from(sorted(PG_POOL)), min_size=1, max_size=6),
        min_size=1,
        max_size=3,
    )
)
def test_any_sequence_of_statements_persists_nothing(
    pg_url: str, sessions: list[list[str]]
) -> None:
    with open_store(pg_url, projections=TOTALS) as store:
        if store.head_position() == 0:
            store.append("a", [added(1), added(2)])
    before = _snapshot(pg_url)
    with open_store(pg_url, read_only=True, projections=TOTALS) as ro:
        for statements in sessions:
            _send(ro, statements)
        assert ro.head_position() == 2
    assert _snapshot(pg_url) == before
