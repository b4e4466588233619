"""One contract for every response cache, run on real Redis (loopback) and a real SQLite file.

Each backend fixture knows how to build a cache, an unreachable one, how to plant raw bytes under
a key, and how to let time pass (SQLite: the injected clock; Redis: shrink each key's PTTL, the
server-side view of the same thing). Backend-only checks follow the shared suite.
"""

from __future__ import annotations

import logging
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from trm_llm.cache import CachedResponse, CacheKeyError, ResponseCache, build_cache_key
from trm_llm.redis_cache import RedisResponseCache
from trm_llm.settings import CacheTTLError
from trm_llm.sqlite_cache import SqliteResponseCache

from .conftest import FakeClock, ListSink

PROMPT = "What is the capital of Burkina Faso?"
MSGS = [{"role": "user", "content": PROMPT}]
ANSWER = CachedResponse(
    content="Ouagadougou",
    reasoning="capital of BF",
    finish_reason="stop",
    usage={"prompt_tokens": 9, "completion_tokens": 3},
    model="m",
)
KEY = build_cache_key("m", MSGS)


@dataclass
class Backend:
    name: str
    make: Callable[..., ResponseCache]  # (namespace=..., sink=..., ttl_s=...) -> cache
    make_unreachable: Callable[[ListSink | None], ResponseCache]
    put_raw: Callable[[ResponseCache, str, bytes], Awaitable[None]]
    advance: Callable[[ResponseCache, float], Awaitable[None]]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
async def redis_client() -> AsyncIterator[Redis]:
    client = Redis(host="127.0.0.1", port=6379)
    prefix = f"trmtest:{uuid.uuid4().hex}"
    client.trm_test_prefix = prefix  # type: ignore[attr-defined]
    yield client
    names = [name async for name in client.scan_iter(match=f"{prefix}*")]
    if names:
        await client.delete(*names)
    await client.aclose()


@pytest.fixture
async def redis_backend(redis_client: Redis) -> AsyncIterator[Backend]:
    prefix: str = redis_client.trm_test_prefix  # type: ignore[attr-defined]
    dead: list[Redis] = []

    def make(namespace: str = "a", sink: ListSink | None = None, ttl_s: int = 60) -> ResponseCache:
        return RedisResponseCache(
            redis_client, ttl_s=ttl_s, namespace=f"{prefix}:{namespace}", sink=sink
        )

    def make_unreachable(sink: ListSink | None) -> ResponseCache:
        client = Redis(host="127.0.0.1", port=_closed_port(), retry=Retry(NoBackoff(), 0))
        dead.append(client)
        return RedisResponseCache(client, ttl_s=60, namespace=f"{prefix}:dead", sink=sink)

    async def put_raw(cache: ResponseCache, key: str, raw: bytes) -> None:
        assert isinstance(cache, RedisResponseCache)
        await redis_client.set(cache.redis_key(key), raw, ex=60)

    async def advance(cache: ResponseCache, seconds: float) -> None:
        assert isinstance(cache, RedisResponseCache)
        async for name in redis_client.scan_iter(match=f"{cache.namespace}:*"):
            left_ms = await redis_client.pttl(name) - int(seconds * 1000)
            await redis_client.pexpire(name, max(left_ms, 0))  # 0: expired now

    yield Backend("redis", make, make_unreachable, put_raw, advance)
    for client in dead:
        await client.aclose()


@pytest.fixture
def sqlite_backend(tmp_path: Path) -> Backend:
    clock = FakeClock()
    path = tmp_path / "cache.db"

    def make(namespace: str = "a", sink: ListSink | None = None, ttl_s: int = 60) -> ResponseCache:
        return SqliteResponseCache(path, ttl_s=ttl_s, namespace=namespace, sink=sink, clock=clock)

    def make_unreachable(sink: ListSink | None) -> ResponseCache:
        directory = tmp_path / "a-directory"
        directory.mkdir(exist_ok=True)
        return SqliteResponseCache(directory, ttl_s=60, sink=sink, clock=clock)

    async def put_raw(cache: ResponseCache, key: str, raw: bytes) -> None:
        assert isinstance(cache, SqliteResponseCache)
        with sqlite3.connect(path) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO llm_response_cache VALUES (?, ?, ?, ?)",
                (cache.namespace, key, raw, clock.now + 60),
            )
        conn.close()

    async def advance(cache: ResponseCache, seconds: float) -> None:
        clock.now += seconds

    return Backend("sqlite", make, make_unreachable, put_raw, advance)


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "sqlite"])
def backend(request: pytest.FixtureRequest) -> Backend:
    result: Backend = request.getfixturevalue(f"{request.param}_backend")
    return result


# --- the shared contract -----------------------------------------------------------------------


async def test_round_trip(backend: Backend) -> None:
    sink = ListSink()
    cache = backend.make(sink=sink)
    assert await cache.set(KEY, ANSWER) is True
    assert await cache.get(KEY) == ANSWER
    bare = CachedResponse(content="", finish_reason="length", model="m")
    assert await cache.set(KEY, bare) is True  # overwrite: the latest answer wins
    assert await cache.get(KEY) == bare
    assert sink.events == []


async def test_a_key_never_set_is_a_miss(backend: Backend) -> None:
    sink = ListSink()
    cache = backend.make(sink=sink)
    await cache.set(KEY, ANSWER)
    assert await cache.get(build_cache_key("m", MSGS, "other")) is None
    assert sink.events == []


async def test_entry_lives_for_ttl_seconds_then_misses(backend: Backend) -> None:
    cache = backend.make(ttl_s=60)
    await cache.set(KEY, ANSWER)
    await backend.advance(cache, 59)
    assert await cache.get(KEY) == ANSWER
    await backend.advance(cache, 1)
    assert await cache.get(KEY) is None


async def test_namespaces_are_isolated(backend: Backend) -> None:
    first, second = backend.make(namespace="a"), backend.make(namespace="b")
    await first.set(KEY, ANSWER)
    assert await second.get(KEY) is None
    other = ANSWER.model_copy(update={"content": "Bobo-Dioulasso"})
    await second.set(KEY, other)
    assert await first.get(KEY) == ANSWER
    assert await second.get(KEY) == other


async def test_same_epoch_salt_hits_and_another_epoch_misses(backend: Backend) -> None:
    cache = backend.make()
    await cache.set(cache.build_key("m", MSGS, "run7:e1"), ANSWER)
    assert await cache.get(cache.build_key("m", MSGS, "run7:e1")) == ANSWER  # resumed epoch
    assert await cache.get(cache.build_key("m", MSGS, "run7:e2")) is None  # next epoch re-samples
    assert await cache.get(cache.build_key("m", MSGS)) is None  # unsalted is its own key


def test_build_key_is_the_pure_key_function(backend: Backend) -> None:
    cache = backend.make()
    args = ("m", MSGS, "s", {"temperature": 0.2})
    assert cache.build_key(*args, endpoint="e") == build_cache_key(*args, endpoint="e")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json", "bad_json"),
        (b"\xff\xfe\x00garbage", "bad_json"),
        (b"[]", "wrong_shape"),
        (
            b'{"v": 1, "response": {"content": 7, "finish_reason": "stop", "model": "m"}}',
            "wrong_shape",
        ),
        (b'{"v": 1, "response": {"content": "x", "model": "m"}}', "wrong_shape"),
        (b'{"v": 1, "response": {}, "extra": 1}', "wrong_shape"),
        (
            b'{"v": 2, "response": {"content": "x", "finish_reason": "stop", "model": "m"}}',
            "wrong_version",
        ),
        (
            b'{"v": true, "response": {"content": "x", "finish_reason": "stop", "model": "m"}}',
            "wrong_version",
        ),
    ],
)
async def test_corrupt_entry_is_a_miss_and_an_event(
    backend: Backend, raw: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    sink = ListSink()
    cache = backend.make(sink=sink)
    await cache.set(KEY, ANSWER)
    await backend.put_raw(cache, KEY, raw)
    with caplog.at_level(logging.WARNING, logger="trm_llm.cache"):
        assert await cache.get(KEY) is None
    [event] = sink.of("cache_corrupt")
    assert event["reason"] == reason
    assert (event["backend"], event["key"]) == (backend.name, KEY)
    assert sink.events[0][0] == "cache"
    assert any("cache_corrupt" in record.getMessage() for record in caplog.records)
    assert await cache.set(KEY, ANSWER) is True  # a fresh answer repairs the entry
    assert await cache.get(KEY) == ANSWER


async def test_failed_write_returns_false_and_is_reported(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    sink = ListSink()
    cache = backend.make_unreachable(sink)
    with caplog.at_level(logging.WARNING, logger="trm_llm.cache"):
        assert await cache.set(KEY, ANSWER) is False
        assert await cache.get(KEY) is None
    [written] = sink.of("cache_write_failed")
    [read] = sink.of("cache_read_failed")
    assert written["key"] == read["key"] == KEY
    assert written["error"] and written["detail"]
    messages = [record.getMessage() for record in caplog.records]
    assert any("cache_write_failed" in m for m in messages)
    assert any("cache_read_failed" in m for m in messages)


async def test_failed_write_without_a_sink_is_still_logged(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    cache = backend.make_unreachable(None)
    with caplog.at_level(logging.WARNING, logger="trm_llm.cache"):
        assert await cache.set(KEY, ANSWER) is False
    assert any("cache_write_failed" in record.getMessage() for record in caplog.records)


async def test_a_broken_sink_does_not_break_the_cache(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenSink:
        def emit(self, source: str, event_type: str, data: Mapping[str, Any]) -> None:
            raise RuntimeError("sink down")

    cache = backend.make_unreachable(BrokenSink())  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="trm_llm.cache"):
        assert await cache.set(KEY, ANSWER) is False
    assert any("event sink failed" in record.getMessage() for record in caplog.records)


async def test_a_key_that_is_not_a_digest_is_refused(backend: Backend) -> None:
    cache = backend.make()
    with pytest.raises(CacheKeyError):
        await cache.set(PROMPT, ANSWER)
    with pytest.raises(CacheKeyError):
        await cache.get(PROMPT)


@pytest.mark.parametrize("ttl", [0, -1, True, False, 1.5, "60", None])
def test_ttl_must_be_a_positive_int(backend: Backend, ttl: Any) -> None:
    with pytest.raises(CacheTTLError, match="REDIS_CACHE_TTL"):
        backend.make(ttl_s=ttl)


# --- Redis only ------------------------------------------------------------------------------


@pytest.mark.redis
async def test_redis_writes_with_set_ex(redis_backend: Backend, redis_client: Redis) -> None:
    cache = redis_backend.make(ttl_s=777)
    assert isinstance(cache, RedisResponseCache)
    await cache.set(KEY, ANSWER)
    assert 0 < await redis_client.ttl(cache.redis_key(KEY)) <= 777  # -1 would mean no expiry


@pytest.mark.redis
async def test_redis_key_names_are_namespace_and_digest(
    redis_backend: Backend, redis_client: Redis
) -> None:
    cache = redis_backend.make(namespace="names")
    assert isinstance(cache, RedisResponseCache)
    await cache.set(cache.build_key("m", MSGS, "run:e1", {"temperature": 0.3}), ANSWER)
    names = [n.decode() async for n in redis_client.scan_iter(match=f"{cache.namespace}:*")]
    assert len(names) == 1
    namespace, digest = names[0].rsplit(":", 1)
    assert namespace == cache.namespace and len(digest) == 64
    assert "Burkina" not in names[0] and "run:e1" not in names[0]


# --- SQLite only -----------------------------------------------------------------------------


def test_sqlite_touches_no_disk_before_first_use(tmp_path: Path) -> None:
    SqliteResponseCache(tmp_path / "sub" / "cache.db", ttl_s=60)
    assert list(tmp_path.iterdir()) == []


async def test_sqlite_creates_parent_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "cache.db"
    cache = SqliteResponseCache(path, ttl_s=60)
    assert await cache.set(KEY, ANSWER)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()


async def test_sqlite_write_blocked_by_another_writer_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    sink = ListSink()
    cache = SqliteResponseCache(path, ttl_s=60, sink=sink, busy_timeout_s=0)
    await cache.set(KEY, ANSWER)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process is mid-write and holds the lock
        assert await cache.set(build_cache_key("m", MSGS, "x"), ANSWER) is False
        assert await cache.get(KEY) == ANSWER  # WAL: readers are not blocked by the writer
    finally:
        other.execute("ROLLBACK")
        other.close()
    [event] = sink.of("cache_write_failed")
    assert event["error"] == "OperationalError" and "locked" in event["detail"]


async def test_sqlite_new_file_waits_for_a_writer_that_holds_it(tmp_path: Path) -> None:
    """Found in CI (test_sqlite_several_processes_write_at_once, one run in many): processes
    opening a new cache file together. The switch to WAL is refused at once, without SQLite's
    busy handler, while another connection holds the write lock on a file not in WAL yet; the
    first write then failed with "database is locked". It waits now, up to the busy timeout."""
    path = tmp_path / "cache.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE before_the_cache (x)")  # the file exists, not in WAL yet
    other.execute("BEGIN IMMEDIATE")
    sink = ListSink()
    cache = SqliteResponseCache(path, ttl_s=60, sink=sink, busy_timeout_s=10)
    release = threading.Timer(0.3, other.execute, ("COMMIT",))
    release.start()
    try:
        assert await cache.set(KEY, ANSWER) is True
    finally:
        release.join()
        other.close()
    assert sink.of("cache_write_failed") == []
    assert await cache.get(KEY) == ANSWER


async def test_sqlite_purges_expired_rows_on_write(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "cache.db"
    cache = SqliteResponseCache(path, ttl_s=10, clock=clock)
    await cache.set(KEY, ANSWER)
    clock.now += 10
    await cache.set(build_cache_key("m", MSGS, "later"), ANSWER)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM llm_response_cache").fetchone() == (1,)
    conn.close()


@pytest.mark.slow
def test_sqlite_several_processes_write_at_once(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    script = textwrap.dedent(
        """
        import asyncio, sys
        from trm_llm.cache import CachedResponse, build_cache_key
        from trm_llm.sqlite_cache import SqliteResponseCache

        async def main(worker):
            cache = SqliteResponseCache(sys.argv[1], ttl_s=60)
            for i in range(40):
                key = build_cache_key("m", [{"role": "user", "content": f"{worker}-{i}"}])
                value = CachedResponse(content=f"{worker}-{i}", finish_reason="stop", model="m")
                assert await cache.set(key, value), (worker, i)

        asyncio.run(main(sys.argv[2]))
        """
    )
    workers = [
        subprocess.Popen([sys.executable, "-c", script, str(path), str(w)]) for w in range(3)
    ]
    assert [worker.wait(timeout=60) for worker in workers] == [0, 0, 0]
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT count(*) FROM llm_response_cache").fetchone()
    conn.close()
    assert rows == (120,)
