"""A small event type and projection the store tests drive the log with, a child process that
writes to a store and dies (a SIGKILLed writer, for the lease tests), a forked child, and the
checks that a log is whole and holds exactly what threads were returned."""

from __future__ import annotations

import fcntl
import gc
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, select

from trm_store import NewEvent, Projection, RecordedEvent, Store, register_event_type
from trm_store.append_queue import AppendQueue

ROOT = Path(__file__).resolve().parents[2]


def die_in_a_child(url: str, stream_key: str, body: str) -> None:
    """Run `body` in a child process with `store` open on `url` and `sys.argv[2]` set to
    `stream_key`, then exit without any cleanup (`os._exit`), as a killed process would."""
    code = (
        "import os, sys\n"
        "from trm_store import open_store\n"
        "store = open_store(sys.argv[1])\n"
        f"{body}"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, url, stream_key], cwd=ROOT, check=True, timeout=60)


def in_a_forked_child(body: Callable[[], bytes]) -> bytes:
    """What `body` returns when run in a forked child (which then exits at once, skipping every
    cleanup of the parent's state it inherited); b"" if it raised."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, body())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    return said


class Added(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    amount: int
    note: str = ""


register_event_type("test.added", Added)
register_event_type("test.noted", Added)
"""An event no test projection takes: on PostgreSQL the database numbers its appends
(`trm_store.postgres_append`), where `test.added` ones go statement by statement."""


class Totals(Projection):
    """Per stream: the sum of `amount` and how many events were added."""

    name = "test_totals"
    version = 1
    event_types = frozenset({"test.added"})

    def extra_columns(self) -> list[Column[int]]:
        """Columns a later version adds (none here)."""
        return []

    def extra_values(self, total: int) -> dict[str, int]:
        """Their values for a stream at `total`."""
        return {}

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        return {
            "totals": Table(
                f"test_totals{suffix}",
                metadata,
                Column("stream_id", String(255), primary_key=True),
                Column("total", Integer, nullable=False),
                Column("count", Integer, nullable=False),
                Column("last_position", Integer, nullable=False),
                *self.extra_columns(),
            )
        }

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        table = tables["totals"]
        for event in events:
            row = conn.execute(
                select(table.c.total, table.c.count).where(table.c.stream_id == event.stream_id)
            ).first()
            total = (row.total if row else 0) + event.data["amount"]
            values = {
                "total": total,
                "count": (row.count if row else 0) + 1,
                "last_position": event.position,
                **self.extra_values(total),
            }
            if row is None:
                conn.execute(table.insert().values(stream_id=event.stream_id, **values))
            else:
                conn.execute(
                    table.update().where(table.c.stream_id == event.stream_id).values(**values)
                )


TOTALS = {"test_totals": Totals()}

EVENT_INSERTS = ("INSERT INTO events ", "INSERT OR ROLLBACK INTO events ")
"""How the statement that inserts an append's events starts: OR ROLLBACK on SQLite
(`trm_store.rows_insert`), plain on PostgreSQL."""


class NamedTotals(Totals):
    """`Totals` under another name, in tables of its own: a second (third...) projection."""

    def __init__(self, name: str) -> None:
        self.name = name

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        table = super().define(metadata, suffix)["totals"]
        return {"totals": table.to_metadata(MetaData(), name=f"{self.name}{suffix}")}


class TotalsV2(Totals):
    """The same read model at a new version with a new column, as after an upgrade."""

    version = 2

    def extra_columns(self) -> list[Column[int]]:
        return [Column("doubled", Integer, nullable=False)]

    def extra_values(self, total: int) -> dict[str, int]:
        return {"doubled": 2 * total}


class Tableless(Projection):
    """A projection of `test.added` events with no tables: a test's `apply` does the rest."""

    version = 1
    event_types = frozenset({"test.added"})

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        return {}


class GcProbe(Projection):
    """Writes nothing; notes whether Python's cyclic GC is on each time it applies a batch (and
    prints it to stderr when `report`, for a child process)."""

    name = "test_gc_probe"
    version = 1
    event_types = frozenset({"test.added"})

    def __init__(self, *, report: bool = False) -> None:
        self.report = report
        self.seen: list[bool] = []

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        table = Table(f"test_gc_probe{suffix}", metadata, Column("k", Integer, primary_key=True))
        return {"probe": table}

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        self.seen.append(gc.isenabled())
        if self.report:
            print(f"gc-enabled={gc.isenabled()}", file=sys.stderr, flush=True)


def added(amount: int, **kwargs: object) -> NewEvent:
    return NewEvent("test.added", {"amount": amount}, **kwargs)  # type: ignore[arg-type]


def noted(amount: int) -> NewEvent:
    return NewEvent("test.noted", {"amount": amount})


def totals(store: object) -> dict[str, tuple[int, int]]:
    """stream_id -> (total, count) as the projection has it."""
    with store.query("test_totals") as (conn, tables):  # type: ignore[attr-defined]
        t = tables["totals"]
        return {r.stream_id: (r.total, r.count) for r in conn.execute(select(t))}


def replayed_totals(store: object) -> dict[str, tuple[int, int]]:
    """The same figures computed straight from the log."""
    result: dict[str, tuple[int, int]] = {}
    for event in store.read_all():  # type: ignore[attr-defined]
        if event.type == "test.added":
            total, count = result.get(event.stream_id, (0, 0))
            result[event.stream_id] = (total + event.data["amount"], count + 1)
    return result


@contextmanager
def writing_held(queue: AppendQueue) -> Iterator[None]:
    """This thread in the place of the queue's writer: appends queue behind it until the block
    ends, then go as one group, as behind a writer that just finished."""
    with queue._lock:
        assert not queue._writing
        queue._writing = True
    try:
        yield
    finally:
        queue._writing = False
        queue._wake_waiting()


def log_of(store: Store) -> list[RecordedEvent]:
    """Every event of the log, in position order."""
    return list(store.read_all())


def assert_log_is_whole(store: Store) -> None:
    """Positions 1..n and each stream's versions 1..k, none skipped; totals match the log."""
    log = log_of(store)
    assert [e.position for e in log] == list(range(1, len(log) + 1))
    versions: dict[str, list[int]] = {}
    for e in log:
        versions.setdefault(e.stream_id, []).append(e.version)
    assert all(v == list(range(1, len(v) + 1)) for v in versions.values())
    assert totals(store) == replayed_totals(store)
    # Every checkpoint at the head: not past it (a refused append's events counted, on
    # PostgreSQL where the heads' read moves them), nor behind.
    assert {s.checkpoint for s in store.projection_status().values()} == {len(log)}


def run_and_compare(
    store: Store, worker: Callable[[int], None], count: int, returned: list[list[RecordedEvent]]
) -> dict[str, RecordedEvent]:
    """Run `worker(0..count-1)` in threads; the log by event id, once checked to hold exactly
    the events `returned` to the workers, field for field, and to be whole."""
    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60.0)
        assert not thread.is_alive()
    log = {e.event_id: e for e in log_of(store)}
    assert sorted(log) == sorted(e.event_id for r in returned for e in r)
    assert all(log[e.event_id] == e for r in returned for e in r)
    assert_log_is_whole(store)
    return log


def open_on(path: str) -> int:
    """How many of this process's descriptors are open on the file at `path`, or on one that
    was there and is deleted (SQLite deletes the WAL as the last connection closes)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        count += target in (path, f"{path} (deleted)")
    return count


def flock_free(path: str) -> bool:
    """Whether another open file of `path` (as another process would) gets its `flock` now:
    taken and let go again."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the descriptor lets the lock go
    return True
