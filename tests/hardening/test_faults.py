"""Faults in the parts trm runs on (issue 7.3): each fails cleanly, typed, with nothing partial.

- Redis killed (SIGKILL) and restarted mid-run: calls keep working uncached, say so in events and
  warnings, and no stale or partial entry is left;
- the PostgreSQL connection terminated inside an append: a typed StoreError, nothing in the log,
  and the retry with the same event id is exactly-once;
- a full disk under SQLite (`PRAGMA max_page_count`): a typed "disk full" error, nothing written,
  the store opens and reads afterwards;
- a corrupted SQLite file: the same clear StoreError on every open, never an untyped crash.

Redis here is a private `redis-server` on a free loopback port; the shared one is never touched.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from sqlalchemy import Connection, Table, create_engine, event, text

from trm_llm.cache import CachedResponse, decode_entry
from trm_llm.client import GovernedLLMClient
from trm_llm.redis_cache import RedisResponseCache
from trm_llm.simulated_server import SimulatedServer, cut, normal
from trm_store import (
    NewEvent,
    RecordedEvent,
    StoreError,
    open_store,
    read_diagnoses,
    record_diagnosis,
)
from trm_store.domain.diagnosis import QUESTION_DIAGNOSED, DiagnosesProjection
from trm_store.projections import registered_projections

from ..llm.conftest import ListSink
from ..llm.private_redis import PrivateRedis

# -- Redis killed and restarted mid-run -------------------------------------------------------


class KillRedisDuringReply(SimulatedServer):
    """Kills the private Redis while answering one request: after the cache read, before the
    cache write of the same call."""

    def __init__(self, redis_server: PrivateRedis) -> None:
        super().__init__()
        self.redis_server = redis_server
        self.kill_on_next = False

    def respond(self, body: Any) -> Any:
        if self.kill_on_next:
            self.kill_on_next = False
            self.redis_server.kill()
        return super().respond(body)


def _ask(text_: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text_}]


async def _entries(client: Redis, namespace: str) -> dict[str, CachedResponse]:
    names = [name async for name in client.scan_iter(match=f"{namespace}:*")]
    entries = {}
    for name in names:
        raw = await client.get(name)
        assert raw is not None
        entries[name.decode()] = decode_entry(raw)
    return entries


async def test_redis_killed_and_restarted_mid_run(
    private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trm_llm.cache")
    redis_client = Redis(
        host="127.0.0.1",
        port=private_redis.port,
        retry=Retry(NoBackoff(), 0),
        socket_connect_timeout=2,
        socket_timeout=2,
    )
    sink = ListSink()
    namespace = "hardening:llm"
    cache = RedisResponseCache(redis_client, ttl_s=600, namespace=namespace, sink=sink)
    try:
        server = KillRedisDuringReply(private_redis)
        async with server:
            server.default = normal(["full", " answer"])
            async with GovernedLLMClient(server.base_url, "sim", cache=cache, sink=sink) as client:
                # Up: a truncated stream is retried and never cached; the complete answer is.
                server.script(cut(), normal(["full", " answer"]))
                first = await client.chat(_ask("a"))
                assert (first.content, first.attempts) == ("full answer", 2)
                assert (await client.chat(_ask("a"))).cached is True

                # Killed between this call's cache read and its cache write.
                server.kill_on_next = True
                during = await client.chat(_ask("b"))
                assert (during.content, during.cached) == ("full answer", False)
                # Down: a read failure is a miss, the call still succeeds, uncached.
                down = await client.chat(_ask("a"))
                assert (down.content, down.cached) == ("full answer", False)

                # Restarted on the same port (empty: no persistence): caching resumes.
                private_redis.start()
                after = [await client.chat(_ask(q)) for q in ("b", "b", "c")]
                assert [r.cached for r in after][1:] == [True, False]
                assert all(r.content == "full answer" for r in after)
                entries = await _entries(redis_client, namespace)
                keys = [
                    cache.redis_key(cache.build_key("sim", _ask(q), endpoint=client.base_url))
                    for q in ("b", "c")
                ]
    finally:
        await redis_client.aclose()

    problems = [kind for _, kind, _ in sink.events if kind.startswith("cache_")]
    # "b" could not be written (killed mid-call); "a" could be neither read nor written.
    assert problems == ["cache_write_failed", "cache_read_failed", "cache_write_failed"]
    writes = [c["cache_write"] for c in sink.of("call_completed")]
    assert writes == ["written", None, "failed", "failed", "written", None, "written"]
    warnings = [r.getMessage() for r in caplog.records if r.name == "trm_llm.cache"]
    assert any(w.startswith("cache_write_failed") for w in warnings)
    assert any(w.startswith("cache_read_failed") for w in warnings)
    # Only whole answers, only those written since the restart ("a" died with the old server).
    assert sorted(entries) == sorted(keys)
    for entry in entries.values():
        assert (entry.content, entry.finish_reason) == ("full answer", "stop")


# -- PostgreSQL: the connection dies inside an append ------------------------------------------


class TerminatedMidApply(DiagnosesProjection):
    """The `diagnoses` projection, except that while armed it has an admin connection terminate
    its own backend inside the append's transaction (after the event row was inserted)."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.armed = True
        self.killed_pid: int | None = None

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        if self.armed:
            self.armed = False
            self.killed_pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            admin = create_engine(self.admin_url)
            try:
                with admin.begin() as other:
                    assert other.execute(
                        text("SELECT pg_terminate_backend(:pid)"), {"pid": self.killed_pid}
                    ).scalar_one()
            finally:
                admin.dispose()
        super().apply(conn, tables, events)


@pytest.mark.postgres
def test_pg_connection_terminated_mid_append_then_retry_is_exactly_once(pg_url: str) -> None:
    event_id = str(uuid.uuid4())
    new = NewEvent(
        QUESTION_DIAGNOSED,
        {"question_id": "q1", "tier": "wrong", "detail": None},
        event_id=event_id,
    )
    killer = TerminatedMidApply(pg_url)
    projections = {**registered_projections(), killer.name: killer}
    with open_store(pg_url, projections=projections) as store:
        with pytest.raises(StoreError, match="lost the connection") as info:
            store.append("diagnosis:r1", [new])
        assert type(info.value) is StoreError and killer.killed_pid is not None
        assert store.head_position() == 0 and store.read_stream("diagnosis:r1") == []
        [first] = store.append("diagnosis:r1", [new])  # the retry: same id, fresh connection
        [again] = store.append("diagnosis:r1", [new])  # and again: still exactly once
        assert first.position == again.position == 1
        assert [e.event_id for e in store.read_all()] == [event_id]
        assert list(read_diagnoses(store, "r1")) == ["q1"]
        assert store.verify_projections() == []


# -- SQLite: the disk fills up -----------------------------------------------------------------


def test_sqlite_disk_full_is_typed_and_writes_nothing(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    try:
        record_diagnosis(store, run_id="r1", question_id="q1", tier="wrong")
        before = list(store.read_all())
        # A "full disk": no connection of this store may grow the file past its current size.
        # The store's own connections (the pragma is per connection): closed, reopened capped.
        store._backend.close()
        engine = store._backend.engine

        def _cap(dbapi_connection: Any, _record: Any) -> None:
            pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
            dbapi_connection.execute(f"PRAGMA max_page_count={pages}")

        event.listen(engine, "connect", _cap)

        big = {"blob": "x" * 300_000}
        with pytest.raises(StoreError, match="disk full") as info:
            record_diagnosis(store, run_id="r1", question_id="q2", tier="wrong", detail=big)
        assert "nothing was written" in str(info.value)
        assert list(store.read_all()) == before
    finally:
        store.close()
    with open_store(sqlite_url) as reopened:  # space again: opens, reads, verifies, appends
        assert list(reopened.read_all()) == before
        assert reopened.verify_projections() == []
        record_diagnosis(reopened, run_id="r1", question_id="q2", tier="wrong", detail=big)
        assert reopened.head_position() == len(before) + 1


# -- SQLite: a corrupted file ------------------------------------------------------------------


def _garbage(n: int) -> bytes:
    return (b"\xde\xad\xbe\xef" * (n // 4 + 1))[:n]


CORRUPTIONS: dict[str, Callable[[int], tuple[int, bytes]]] = {
    "header": lambda size: (0, _garbage(16)),  # the "SQLite format 3" magic
    "schema page": lambda size: (100, _garbage(3000)),  # page 1: sqlite_master
    "all data pages": lambda size: (4096, _garbage(size - 4096)),
}


@pytest.fixture(scope="module")
def healthy_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("healthy") / "trm.db"
    with open_store(f"sqlite:///{path}") as store:
        for i in range(200):
            record_diagnosis(
                store, run_id="r1", question_id=f"q{i}", tier="wrong", detail="y" * 200
            )
    assert not Path(f"{path}-wal").exists()  # checkpointed: all of it is in the main file
    return path


@pytest.mark.parametrize("where", list(CORRUPTIONS))
def test_corrupt_sqlite_file_raises_the_same_clear_error_on_every_open(
    healthy_db: Path, tmp_path: Path, where: str
) -> None:
    path = tmp_path / "trm.db"
    shutil.copy(healthy_db, path)
    offset, garbage = CORRUPTIONS[where](os.path.getsize(path))
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(garbage)
    messages = []
    for read_only in (False, True, False, False):
        with pytest.raises(StoreError) as info:
            open_store(f"sqlite:///{path}", read_only=read_only).close()
        assert type(info.value) is StoreError
        messages.append(str(info.value))
    assert "is corrupt or not a trm store" in messages[0]
    assert len(set(messages)) == 1  # no crash loop: the same message each time


def test_corruption_deep_in_the_log_is_a_typed_error_when_read(
    healthy_db: Path, tmp_path: Path
) -> None:
    """Open reads only the head of the log, so damage in the middle shows on the first full read."""
    path = tmp_path / "trm.db"
    shutil.copy(healthy_db, path)
    size = os.path.getsize(path)
    with path.open("r+b") as f:
        f.seek(size // 2)
        f.write(_garbage(size // 4))
    for read_only in (True, False):
        try:
            store = open_store(f"sqlite:///{path}", read_only=read_only)
        except StoreError as e:  # an open that does notice must say why
            assert "is corrupt or not a trm store" in str(e)
            continue
        with store, pytest.raises(StoreError, match="is corrupt or not a trm store"):
            list(store.read_all())
