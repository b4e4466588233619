"""Rebuilds are owned: processes opening, rebuilding and verifying while others append never
collide, a killed rebuild is redone by the next opener, and verify's scratch is its own.

Every process here is a real one (`tests.store.rebuild_workers`), killed with SIGKILL where the
test says so; the store is a real SQLite file or a real PostgreSQL schema.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.store.helpers import Totals, TotalsV2, added, replayed_totals, totals
from trm_store import Projection, Store, domain, open_store
from trm_store.errors import StaleProjectionError, StoreError
from trm_store.projection_state import statuses
from trm_store.projections import registered_projections
from trm_store.rebuild_lock import REBUILD_LOCK_NAMESPACE, advisory_key

ROOT = Path(__file__).resolve().parents[2]
SEEDED = 1500
"""Events before the children start: a rebuild takes several batches of 1000."""


def _projections(totals: Totals | None = None) -> dict[str, Projection]:
    """The children's projections: the domain's and `Totals` (registered there, not here)."""
    domain.load()
    return {**registered_projections(), "test_totals": totals or Totals()}


def _seed(url: str) -> None:
    with open_store(url, projections=_projections()) as store:
        for start in range(0, SEEDED, 200):
            store.append_batch(
                [(f"s-{i % 7}", [added(i)], None) for i in range(start, min(start + 200, SEEDED))]
            )


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.store.rebuild_workers", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextmanager
def _hanging(mode: str, url: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """A child started in `mode` (rebuild-then-hang, verify-then-hang), yielded once it is
    mid-way, SIGKILLed at the end of the block if it still runs."""
    child = _child(mode, url, *args)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == "filling\n", child.stderr.read() if child.stderr else line
        yield child
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)


def _status(store: Store) -> dict[str, str]:
    with store.write_transaction() as conn:
        return {name: s.status for name, s in statuses(conn).items()}


def _consistent(store: Store) -> None:
    assert store.verify_projections() == []
    assert totals(store) == replayed_totals(store)
    assert set(_status(store).values()) == {"ready"}


@pytest.mark.slow
def test_processes_opening_rebuilding_and_verifying_while_others_append(store_url: str) -> None:
    _seed(store_url)
    plan = [
        ("append", "100"),
        ("append", "100"),
        ("rebuild", "2"),
        ("rebuild", "2"),
        ("open", "3"),
        ("open", "3"),
        ("verify", "2"),
        ("verify", "2"),
    ]
    children = [(mode, _child(mode, store_url, rounds)) for mode, rounds in plan]
    failures = []
    for mode, child in children:
        _, err = child.communicate(timeout=600)
        if child.returncode != 0:
            failures.append(f"{mode} exited {child.returncode}:\n{err[-3000:]}")
    assert failures == [], "\n".join(failures)
    with open_store(store_url, projections=_projections()) as store:
        _consistent(store)


@pytest.mark.slow
def test_an_opener_serves_during_a_live_rebuild_and_a_second_rebuild_waits(
    store_url: str,
) -> None:
    _seed(store_url)
    with _hanging("rebuild-then-hang", store_url) as child:
        started = time.monotonic()
        with open_store(store_url, projections=_projections()) as store:
            assert time.monotonic() - started < 30
            # The opener left the live owner's rebuild alone and reads the live tables, which
            # appends keep current meanwhile.
            assert set(_status(store).values()) == {"rebuilding"}
            store.append("s-extra", [added(5)])
            assert totals(store) == replayed_totals(store)
            assert store.verify_projections() == []
            with open_store(store_url, read_only=True, projections=_projections()) as reader:
                assert totals(reader) == replayed_totals(store)

            done: list[dict[str, int]] = []
            waiting = threading.Thread(target=lambda: done.append(store.rebuild_projections()))
            waiting.start()
            waiting.join(timeout=3)
            assert waiting.is_alive() and not done, "a second rebuild ran over the live one"
            child.send_signal(signal.SIGKILL)
            waiting.join(timeout=120)
            assert done and done[0]["test_totals"] == SEEDED + 1
            _consistent(store)


@pytest.mark.slow
def test_the_next_opener_redoes_a_rebuild_killed_mid_way(store_url: str) -> None:
    _seed(store_url)
    with _hanging("rebuild-then-hang", store_url) as child:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    with open_store(store_url, projections=_projections()) as store:
        _consistent(store)
        if store.dialect == "sqlite":
            with store.write_transaction() as conn:
                names = conn.execute(text("SELECT name FROM sqlite_master")).scalars().all()
            assert not [n for n in names if n.endswith("__rebuild")]


def _scratch_relations(url: str) -> list[str]:
    """Tables or indexes named like a verify's scratch anywhere in the store's database files
    or schema (TEMP tables of live sessions excepted: they are private to their session)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                query = "SELECT name FROM sqlite_master"
            else:
                query = (
                    "SELECT c.relname FROM pg_class c JOIN pg_namespace n"
                    " ON n.oid = c.relnamespace WHERE n.nspname = current_schema()"
                )
            return [n for n in conn.execute(text(query)).scalars() if "__verify" in n]
    finally:
        engine.dispose()


@pytest.mark.slow
def test_verifies_use_scratch_space_of_their_own(store_url: str) -> None:
    _seed(store_url)
    with _hanging("verify-then-hang", store_url) as child:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert _scratch_relations(store_url) == []  # a killed verify leaves nothing behind
    with (
        _hanging("verify-then-hang", store_url),
        open_store(store_url, projections=_projections()) as store,
    ):
        # Another verify, meanwhile, does not touch the hanging one's scratch, nor it this one's.
        assert store.verify_projections() == []
        store.append("s-extra", [added(5)])
        assert store.verify_projections() == []
    with open_store(store_url, projections=_projections()) as store:
        _consistent(store)


@pytest.mark.slow
def test_an_opener_at_a_new_version_waits_for_a_live_rebuild_to_it(store_url: str) -> None:
    """A projection whose version changed cannot be served from its old tables: a writable
    opener waits for the live owner (then has nothing left to rebuild), a read-only reader is
    told it is stale, and a process still at the old version reads the old tables meanwhile."""
    _seed(store_url)
    new = _projections(TotalsV2())
    with _hanging("rebuild-then-hang", store_url, "2") as child:
        with (
            open_store(store_url, read_only=True, projections=new) as reader,
            pytest.raises(StaleProjectionError),
        ):
            totals(reader)
        with open_store(store_url, read_only=True, projections=_projections()) as old:
            assert totals(old) == replayed_totals(old)
        opened: list[Store] = []
        opener = threading.Thread(
            target=lambda: opened.append(open_store(store_url, projections=new))
        )
        opener.start()
        opener.join(timeout=15)  # longer than a rebuild of the seeded log takes here
        assert opener.is_alive() and not opened, "the opener rebuilt over the live rebuild"
        child.send_signal(signal.SIGKILL)
        opener.join(timeout=120)
        assert opened
        with opened[0] as store:
            _consistent(store)
            assert store.rebuild_projections("test_totals") == {"test_totals": SEEDED}


@pytest.mark.slow
def test_a_rebuild_whose_lock_session_ended_is_not_swapped_in(pg_url: str) -> None:
    """The lock is lost with its session (here ended by the server, as a network cut would): the
    swap checks it still holds it, so a rebuild that may have a rival by now swaps nothing in."""
    _seed(pg_url)
    admin = create_engine(pg_url)

    ended_already: list[bool] = []

    def end_the_lock_session(_n: int) -> None:
        if ended_already:
            return
        ended_already.append(True)
        with admin.begin() as conn:
            key = advisory_key(conn.execute(text("SELECT current_schema()")).scalar_one())
            ended = conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND classid = :k1 AND objid = :k2 AND objsubid = 2"
                ),
                {"k1": REBUILD_LOCK_NAMESPACE, "k2": key},
            )
            assert ended.scalars().all() == [True]

    try:
        with open_store(pg_url, projections=_projections()) as store:
            with pytest.raises(StoreError, match="lost its lock"):
                store.rebuild_projections(progress=end_the_lock_session)
            assert set(_status(store).values()) == {"rebuilding"}
        with open_store(pg_url, projections=_projections()) as store:  # the next opener redoes it
            _consistent(store)
    finally:
        admin.dispose()
