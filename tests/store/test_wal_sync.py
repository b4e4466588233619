"""`durability="full"` on SQLite (`trm_store.wal_sync`): a commit's WAL is synced after the
writer lock is let go and before the write returns, on the WAL SQLite writes; another process
writes meanwhile; a failed sync fails every append it concerns, each told it was committed; a
process killed between its commit and its sync leaves a store that works."""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.pool import Pool

import trm_store.wal_sync
from tests.store.helpers import ROOT, TOTALS, added, flock_free, in_a_forked_child, totals
from trm_store import ConcurrencyError, NewEvent, StoreError, open_store
from trm_store.backend import Durability
from trm_store.wal_sync import WalSync


def committed_events(db: Path) -> int:
    """The events committed to `db`, as another connection sees them."""
    return committed_rows(db, "events")


def committed_rows(db: Path, table: str) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as other:
        count: int = other.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    other.close()
    return count


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Callable[[int], None]]]:
    """The WAL syncs, spied on: each entry of the yielded list runs before the real sync,
    with its descriptor."""
    before: list[Callable[[int], None]] = []
    real = trm_store.wal_sync._datasync

    def spied(fd: int) -> None:
        for check in before:
            check(fd)
        real(fd)

    monkeypatch.setattr(trm_store.wal_sync, "_datasync", spied)
    yield before


def test_a_full_store_syncs_the_wal_after_the_lock_and_before_the_append_returns(
    tmp_path: Path, syncs: list[Callable[[int], None]]
) -> None:
    db = tmp_path / "s.db"
    seen: list[tuple[bool, int, bool]] = []

    def look(fd: int) -> None:
        wal = os.stat(f"{db}-wal")
        same_file = (os.fstat(fd).st_dev, os.fstat(fd).st_ino) == (wal.st_dev, wal.st_ino)
        seen.append((flock_free(f"{db}-writer"), committed_events(db), same_file))

    with open_store(f"sqlite:///{db}", projections=TOTALS, durability="full") as store:
        store.append("a", [added(1)])  # opens the store's writer connection
        syncs.append(look)
        store.append("a", [added(2), added(3)])
        assert seen == [(True, 3, True)]  # lock let go, commit visible, SQLite's WAL
        store.append("b", [added(4)])
        assert seen[-1] == (True, 4, True) and len(seen) == 2
        with store.write_transaction() as conn:  # any write transaction, not appends only
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert len(seen) == 3
        assert totals(store) == {"a": (6, 3), "b": (4, 1)}


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_what_each_durability_sets_on_a_writer_connection(
    tmp_path: Path, durability: Durability, syncs: list[Callable[[int], None]]
) -> None:
    """`normal`: NORMAL and no sync of ours; `full`: NORMAL, and our sync after the lock."""
    calls: list[int] = []
    with open_store(f"sqlite:///{tmp_path}/s.db", projections=TOTALS, durability=durability) as s:
        syncs.append(calls.append)
        s.append("a", [added(1)])
        with s.write_transaction() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    assert len(calls) == (2 if durability == "full" else 0)


def test_a_symlinked_database_syncs_the_wal_sqlite_writes(
    tmp_path: Path, syncs: list[Callable[[int], None]]
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    real = tmp_path / "real" / "s.db"
    link = tmp_path / "links" / "s.db"
    sqlite3.connect(real).close()
    link.symlink_to(real)
    synced: list[tuple[int, int]] = []
    syncs.append(lambda fd: synced.append((os.fstat(fd).st_dev, os.fstat(fd).st_ino)))
    with open_store(f"sqlite:///{link}", projections=TOTALS, durability="full") as store:
        store.append("a", [added(1)])
        (wal,) = [p for p in (tmp_path / "real", tmp_path / "links") for p in p.glob("*-wal")]
        assert synced and set(synced) == {(wal.stat().st_dev, wal.stat().st_ino)}


def test_an_adopted_database_in_another_journal_commits_at_full(
    tmp_path: Path, syncs: list[Callable[[int], None]]
) -> None:
    """A foreign file keeps its rollback journal until trm adopts it: its connections commit at
    FULL, SQLite's own sync (ours would not cover the journal); once adopted, WAL and ours."""
    db = tmp_path / "foreign.db"
    with sqlite3.connect(db) as foreign:
        foreign.execute("CREATE TABLE theirs (x)")
    foreign.close()
    checked_out: list[tuple[str, int, bool]] = []

    def note(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        journal = dbapi_connection.execute("PRAGMA journal_mode").fetchone()[0]
        synchronous = dbapi_connection.execute("PRAGMA synchronous").fetchone()[0]
        checked_out.append(
            (journal, synchronous, bool(record.info.get(trm_store.wal_sync.WAL_SYNCED)))
        )

    event.listen(Pool, "checkout", note)
    try:
        store = open_store(
            f"sqlite:///{db}", projections=TOTALS, durability="full", adopt_database=True
        )
        with store:
            store.append("a", [added(1)])
    finally:
        event.remove(Pool, "checkout", note)
    assert checked_out[0] == ("delete", 2, False)  # the adoption's connection: FULL
    assert ("wal", 1, True) in checked_out[1:]
    assert all(c in {("delete", 2, False), ("wal", 1, True)} for c in checked_out)


def test_a_failed_sync_fails_every_append_of_its_group_then_every_write(
    tmp_path: Path, syncs: list[Callable[[int], None]]
) -> None:
    """Each append of the group is told it was committed; none is written again alone and
    returned as if it were on disk; the store then writes nothing until it is opened again."""
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    first_sync = threading.Event()
    go_on = threading.Event()
    calls = 0

    def hold_then_fail(_fd: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:  # s0's: the others queue meanwhile, and make the next group
            first_sync.set()
            go_on.wait(10)
        else:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    with open_store(url, projections=TOTALS, durability="full") as store:
        store.append("warm", [added(1)])
        syncs.append(hold_then_fail)
        outcomes: dict[str, BaseException | None] = {}

        def append(stream: str) -> None:
            try:
                store.append(stream, [added(1), added(2)])
                outcomes[stream] = None
            except BaseException as e:
                outcomes[stream] = e

        first = threading.Thread(target=append, args=("s0",))
        first.start()
        assert first_sync.wait(10)
        others = [threading.Thread(target=append, args=(f"s{i}",)) for i in range(1, 6)]
        for t in others:
            t.start()
        queue = store._appends
        deadline = time.monotonic() + 10
        while len(queue._queued) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        go_on.set()
        for t in [first, *others]:
            t.join(30)
        assert outcomes.pop("s0") is None
        assert sorted(outcomes) == [f"s{i}" for i in range(1, 6)]
        for stream, error in outcomes.items():
            assert isinstance(error, StoreError), stream
            assert "ended, but syncing" in str(error), stream
            assert os.strerror(errno.EIO) in str(error)
            assert isinstance(error.__cause__, OSError)
        assert committed_events(db) == 1 + 6 * 2  # each written once, none again
        with pytest.raises(StoreError, match="nothing written"):
            store.append("later", [added(1)])
        with pytest.raises(StoreError, match="nothing written"), store.write_transaction():
            pass
        assert committed_events(db) == 1 + 6 * 2
        syncs.clear()
    with open_store(url, projections=TOTALS, durability="full") as store:
        store.append("later", [added(1)])
        assert totals(store)["s3"] == (3, 2) and totals(store)["later"] == (1, 1)


def test_a_retry_that_finds_its_events_recorded_waits_for_a_sync(
    tmp_path: Path, syncs: list[Callable[[int], None]]
) -> None:
    """The process that recorded them was killed between its commit and its sync: the retry
    is told they are recorded only once a sync has put them on disk."""
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url, projections=TOTALS, durability="full") as store:
        child = _child(url)
        _end(child)  # SIGKILL, in its sync: committed, never synced by it
        (recorded,) = store.read_stream("child")
        calls: list[int] = []
        syncs.append(calls.append)
        (again,) = store.append(
            "child", [NewEvent("test.added", {"amount": 5}, event_id=recorded.event_id)]
        )
        # The transaction whose insert the taken event id refused ends with a sync, begun
        # after it saw the events committed.
        assert again == recorded and len(calls) == 1


def test_every_append_returns_after_a_sync_that_began_after_its_commit(
    tmp_path: Path, syncs: list[Callable[[int], None]]
) -> None:
    """6 threads, 20 appends each: when an append returns, a sync has ended that began when
    its last event was committed (positions count the events: the log has no gaps)."""
    db = tmp_path / "s.db"
    covered = 0  # events committed when the latest ended sync began
    lock = threading.Lock()
    with open_store(f"sqlite:///{db}", projections=TOTALS, durability="full") as store:
        store.append("warm", [added(1)])

        def note_coverage(fd: int) -> None:
            nonlocal covered
            begun_with = committed_events(db)
            os.fdatasync(fd)  # the spied sync runs after: this one ends when the coverage counts
            with lock:
                covered = max(covered, begun_with)

        syncs.append(note_coverage)
        late: list[tuple[int, int]] = []

        def appender(k: int) -> None:
            for i in range(20):
                (event,) = store.append(f"t{k}-{i}", [added(1)])
                with lock:
                    if covered < event.position:
                        late.append((event.position, covered))

        threads = [threading.Thread(target=appender, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert committed_events(db) == 1 + 6 * 20
        assert late == []


_CHILD = """
import sys
import trm_store.wal_sync
from tests.store.helpers import TOTALS, added
from trm_store import open_store

real = trm_store.wal_sync._datasync
def held(fd):
    print("syncing", flush=True)
    sys.stdin.readline()
    real(fd)
with open_store(sys.argv[1], projections=TOTALS, durability="full") as store:
    trm_store.wal_sync._datasync = held
    store.append("child", [added(5)])
    print("returned", flush=True)
"""


def _child(url: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "syncing\n"
    except BaseException:
        _end(child)
        raise
    return child


def _end(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.communicate()


def test_another_process_writes_while_one_waits_for_its_sync(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url, projections=TOTALS, durability="full") as store:
        child = _child(url)
        try:
            done = threading.Event()
            threading.Thread(
                target=lambda: (store.append("parent", [added(1)]), done.set()), daemon=True
            ).start()
            assert done.wait(20), "the parent waited for the child's sync"
            assert totals(store) == {
                "child": (5, 1),
                "parent": (1, 1),
            }  # committed, not returned yet
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline() == "returned\n"
            assert child.wait(20) == 0
        finally:
            _end(child)


def test_a_process_killed_between_its_commit_and_its_sync_leaves_a_working_store(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    with open_store(url, projections=TOTALS, durability="full") as store:
        store.append("parent", [added(1)])
        child = _child(url)
        child.send_signal(signal.SIGKILL)
        _end(child)
        # Committed, never acknowledged: the operating system still writes it; the writer lock
        # and the connection died with the process.
        store.append("parent", [added(2)])
        assert totals(store) == {"child": (5, 1), "parent": (3, 2)}
        assert store.verify_projections() == []


def test_the_wal_is_kept_open_and_followed_when_its_directory_is_renamed(
    tmp_path: Path, syncs: list[Callable[[int], None]]
) -> None:
    """One descriptor, opened when the connection was set up (a write-back error is reported
    to it whoever else saw it first), on the file SQLite writes, whatever its name now."""
    before = tmp_path / "before"
    before.mkdir()
    with open_store(f"sqlite:///{before}/s.db", projections=TOTALS, durability="full") as store:
        store.append("a", [added(1)])
        wal = os.stat(before / "s.db-wal")
        synced: list[tuple[int, int, int]] = []
        syncs.append(lambda fd: synced.append((fd, os.fstat(fd).st_dev, os.fstat(fd).st_ino)))
        store.append("a", [added(2)])
        before.rename(tmp_path / "after")
        store.append("a", [added(3)])  # SQLite writes after/s.db-wal, through its descriptor
        assert len(synced) == 2 and synced[0] == synced[1]
        assert synced[0][1:] == (wal.st_dev, wal.st_ino)
        assert os.stat(tmp_path / "after" / "s.db-wal").st_ino == wal.st_ino
        assert totals(store) == {"a": (6, 3)}


def _wal_database(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")  # the WAL itself is made at the next read
    return conn


def test_a_new_database_s_wal_is_opened_when_the_connection_is_set_up(tmp_path: Path) -> None:
    """Before the connection's first commit, so a write-back error of that commit is reported
    to the kept descriptor whoever saw it first."""
    conn = _wal_database(tmp_path / "s.db")
    sync = WalSync("sqlite:///s.db")
    sync.watch(conn.cursor())
    wal = os.stat(tmp_path / "s.db-wal")
    assert sync._fd is not None
    assert (os.fstat(sync._fd).st_dev, os.fstat(sync._fd).st_ino) == (wal.st_dev, wal.st_ino)
    conn.close()


def test_a_wal_that_cannot_be_opened_fails_the_write_not_the_store(tmp_path: Path) -> None:
    """At setup the connection then keeps SQLite's FULL (`watch` says so); a sync that cannot
    open it fails, and the next one, once it can, syncs: no page was lost."""
    here = tmp_path / "here"
    here.mkdir()
    conn = _wal_database(here / "s.db")
    conn.execute("CREATE TABLE t (x)")
    here.rename(tmp_path / "gone")  # the path SQLite gives for the file names nothing now
    sync = WalSync("sqlite:///s.db")
    assert sync.watch(conn.cursor()) is False
    with pytest.raises(StoreError, match="opening its write-ahead log failed"):
        sync.sync()
    assert sync.failed is None
    (tmp_path / "gone").rename(here)
    conn.execute("INSERT INTO t VALUES (1)")
    sync.sync()
    assert os.fstat(sync._fd or -1).st_ino == os.stat(here / "s.db-wal").st_ino
    conn.close()


def test_a_forked_child_syncs_though_a_parent_thread_held_the_lock(tmp_path: Path) -> None:
    conn = _wal_database(tmp_path / "s.db")
    sync = WalSync("sqlite:///s.db")
    sync.watch(conn.cursor())
    with sync._lock:  # this thread's hold is the child's parent's, absent there

        def child() -> bytes:
            fresh = sync._lock.acquire(blocking=False)  # never wait: a failure, not a hang
            if not fresh:
                return b"the parent's lock"
            sync._lock.release()
            if sync._fd is not None:  # the parent's open file, and its record of errors
                return b"the parent's descriptor"
            own = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
            if not sync.watch(own.cursor()):
                return b"no descriptor"
            own.execute("CREATE TABLE t (x)")
            sync.sync()
            return b"synced"

        assert in_a_forked_child(child) == b"synced"
    conn.close()


def test_an_append_refused_by_a_stream_s_version_waits_for_a_sync(
    tmp_path: Path, syncs: list[Callable[[int], None]]
) -> None:
    """The refusal may rest on another process's commit that is not synced yet."""
    with open_store(f"sqlite:///{tmp_path}/s.db", projections=TOTALS, durability="full") as s:
        s.append("a", [added(1)])
        calls: list[int] = []
        syncs.append(calls.append)
        with pytest.raises(ConcurrencyError):
            s.append("a", [added(2)], expected_version=0)
        assert len(calls) == 1


def test_a_block_that_commits_then_raises_is_synced(
    tmp_path: Path, syncs: list[Callable[[int], None]]
) -> None:
    with open_store(f"sqlite:///{tmp_path}/s.db", projections=TOTALS, durability="full") as s:
        calls: list[int] = []
        syncs.append(calls.append)
        with pytest.raises(RuntimeError), s.write_transaction() as conn:
            conn.exec_driver_sql(
                "INSERT INTO run_leases VALUES ('r1', 'h', 1, '2026-12-06 00:00:00.000000')"
            )
            conn.commit()
            raise RuntimeError("after the commit")
        assert len(calls) == 1
        assert committed_rows(tmp_path / "s.db", "run_leases") == 1
