"""Security of the store and the LLM client (issue 7.4).

- a read-only store writes nothing by any path, the database afterwards byte/row-identical;
- hostile strings (SQL, quotes, backslashes, unicode) are data, never SQL, and round-trip verbatim;
- the API key reaches the server's Authorization header and nowhere else;
- Redis key names of caches in different namespaces, and of a shared breaker, never collide.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from sqlalchemy import create_engine, inspect, text

from trm_llm.api_key import exception_chain
from trm_llm.breaker import CircuitBreaker
from trm_llm.cache import CachedResponse, build_cache_key, decode_entry
from trm_llm.client import GovernedLLMClient
from trm_llm.errors import LLMError
from trm_llm.redis_cache import RedisResponseCache
from trm_llm.retry import RetryPolicy
from trm_llm.simulated_server import Reply, SimulatedServer, cut, normal, sse, status
from trm_llm.sink import StoreEventSink
from trm_store import (
    BaselineCache,
    EventValidationError,
    NewEvent,
    ReadOnlyStoreError,
    RunLog,
    Store,
    StoreError,
    get_manifest,
    mark_stale_runs,
    open_store,
    read_diagnoses,
    read_dual_metric,
    record_diagnosis,
    record_run,
    scaffold_workspace,
    update_best,
    update_manifest,
    write_dual_metric,
)
from trm_store.domain.diagnosis import QUESTION_DIAGNOSED

USER = [{"role": "user", "content": "Say hello."}]


# -- helpers -----------------------------------------------------------------------------------


def _populate(store: Store) -> None:
    """One of each record, plus a run left `running` (so mark_stale_runs has work to refuse)."""
    scaffold_workspace(store, "ws1", skills="s1", prompts="p1", model="m")
    record_run(store, "ws1", "run-1", epoch=1)
    with RunLog(store, "run-1", config={"seed": 1}) as log:
        log.record_prediction("q1", unit_id="u1", prediction="A", correct=True, stop_reason="stop")
    RunLog(store, "run-dead", config={"seed": 2}).__enter__()  # registered, never finished
    write_dual_metric(
        store,
        run_id="run-1",
        epoch=1,
        version_kind="final",
        skills_version="s1",
        prompts_version="p1",
        pool="val",
        hard_acc=0.5,
    )
    outcome = {
        "score": 1.0,
        "n_questions": 1,
        "results": [{"question_id": "q1", "correct": True, "stop_reason": "stop"}],
    }
    BaselineCache(store).put("snap-1", "u1", outcome)
    record_diagnosis(store, run_id="run-1", question_id="q1", tier="wrong")


def _snapshot(url: str) -> object:
    """The database's persistent state: the SQLite file's bytes, or every row of every table."""
    if url.startswith("sqlite"):
        return hashlib.sha256(Path(url.removeprefix("sqlite:///")).read_bytes()).hexdigest()
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            tables = sorted(inspect(conn).get_table_names())
            return {
                name: sorted(
                    repr(tuple(row)) for row in conn.execute(text(f'SELECT * FROM "{name}"'))
                )
                for name in tables
            }
    finally:
        engine.dispose()


def _write_paths(ro: Store) -> dict[str, Callable[[], object]]:
    """Every way a caller can try to write through the store."""

    def raw_sql(sql: str) -> Callable[[], None]:
        def run() -> None:
            with ro.query("diagnoses") as (conn, _tables):
                conn.exec_driver_sql(sql)

        return run

    def write_transaction() -> None:
        with ro.write_transaction() as conn:
            conn.exec_driver_sql("DELETE FROM diagnoses")

    def register_run() -> None:
        with RunLog(ro, "run-new", config={"seed": 3}):
            pass

    event = NewEvent(QUESTION_DIAGNOSED, {"question_id": "q9", "tier": "wrong", "detail": None})
    results = [{"question_id": "q2", "correct": False, "stop_reason": "stop"}]
    outcome = {"score": 0.0, "n_questions": 1, "results": results}
    return {
        "append": lambda: ro.append("diagnosis:run-1", [event]),
        "append_batch": lambda: ro.append_batch([("diagnosis:run-1", [event], None)]),
        "rebuild_projections": ro.rebuild_projections,
        "verify_projections": ro.verify_projections,  # it fills scratch tables: a write
        "write_transaction": write_transaction,
        "RunLog(register_run=True)": register_run,
        "scaffold_workspace": lambda: scaffold_workspace(ro, "ws2", skills="s", prompts="p"),
        "update_manifest": lambda: update_manifest(ro, "ws1", skills="s2"),
        "record_run": lambda: record_run(ro, "ws1", "run-2"),
        "update_best": lambda: update_best(ro, "ws1", run_id="run-1"),
        "write_dual_metric": lambda: write_dual_metric(
            ro,
            run_id="run-1",
            epoch=2,
            version_kind="final",
            skills_version="s",
            prompts_version="p",
            pool="val",
            hard_acc=0.1,
        ),
        "BaselineCache.put": lambda: BaselineCache(ro).put("snap-2", "u2", outcome),
        "BaselineCache.invalidate": lambda: BaselineCache(ro).invalidate("snap-1"),
        "record_diagnosis": lambda: record_diagnosis(
            ro, run_id="run-1", question_id="q2", tier="wrong"
        ),
        "mark_stale_runs": lambda: mark_stale_runs(
            ro, timedelta(seconds=1), now=datetime.now(UTC) + timedelta(days=1)
        ),
        "raw DELETE": raw_sql("DELETE FROM diagnoses"),
        "raw INSERT": raw_sql("INSERT INTO diagnoses (run_id) VALUES ('x')"),
        "raw UPDATE": raw_sql("UPDATE diagnoses SET tier = 'right'"),
        "raw DROP": raw_sql("DROP TABLE diagnoses"),
        "raw CREATE": raw_sql("CREATE TABLE evil (x INTEGER)"),
    }


# -- read-only ---------------------------------------------------------------------------------


def test_read_only_store_cannot_write_by_any_path(store_url: str) -> None:
    with open_store(store_url) as store:
        _populate(store)
        head = store.head_position()
    before = _snapshot(store_url)
    with open_store(store_url, read_only=True) as ro:
        assert ro.read_only
        refused = {}
        for name, attempt in _write_paths(ro).items():
            with pytest.raises(ReadOnlyStoreError) as info:
                attempt()
            refused[name] = str(info.value)
        # Reads still work on the same store, and saw no write.
        assert ro.head_position() == head
        assert get_manifest(ro, "ws1")["skills"] == "s1"
        assert len(read_dual_metric(ro, run_id="run-1", epoch=1)) == 1
        with RunLog(ro, "run-1", register_run=False) as baseline:
            assert [p["question_id"] for p in baseline.predictions()] == ["q1"]
    assert len(refused) == len(_write_paths(ro))
    assert _snapshot(store_url) == before


def test_read_only_sqlite_raw_sql_cannot_attach_the_file_writable(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        _populate(store)
    before = _snapshot(sqlite_url)
    path = sqlite_url.removeprefix("sqlite:///")
    with (
        open_store(sqlite_url, read_only=True) as ro,
        pytest.raises(StoreError),
        ro.query("diagnoses") as (conn, _tables),
    ):
        conn.exec_driver_sql(f"ATTACH DATABASE 'file:{path}?mode=rw' AS w")
        conn.exec_driver_sql("DELETE FROM w.diagnoses")
    assert _snapshot(sqlite_url) == before


# -- hostile strings ---------------------------------------------------------------------------


def _table_names(store: Store) -> set[str]:
    with store.query("diagnoses") as (conn, _tables):
        return set(inspect(conn).get_table_names())


HOSTILE = [
    "'; DROP TABLE events; --",
    'Robert"); DROP TABLE runs;--',
    "\\'\\\\ back\\slash \\x00 \\n",
    "%s %(x)s :param ? $1",
    "ünï©ødé 🙂 中文 ﷽ Ω",
    "' OR '1'='1",
]


@pytest.mark.parametrize("hostile", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_strings_are_data_never_sql(store_url: str, hostile: str) -> None:
    with open_store(store_url) as store:
        tables_before = _table_names(store)
        payload = {"s": hostile, hostile: [hostile, {"nested": hostile + "\n\t\r"}]}
        recorded = store.append(
            hostile,
            [
                NewEvent(
                    QUESTION_DIAGNOSED, {"question_id": hostile, "tier": "wrong", "detail": payload}
                )
            ],
        )
        scaffold_workspace(store, hostile, skills=hostile, prompts=hostile, note=hostile)
        record_run(store, hostile, hostile, note=hostile)
        with RunLog(store, hostile, config={hostile: hostile}) as log:
            log.record_prediction(
                hostile, unit_id=hostile, prediction=hostile, correct=True, stop_reason="stop"
            )
        record_diagnosis(store, run_id=hostile, question_id=hostile, tier="wrong", detail=payload)
        results = [{"question_id": hostile, "correct": True, "stop_reason": "stop"}]
        cache = BaselineCache(store)
        cache.put(hostile, hostile, {"score": 1.0, "n_questions": 1, "results": results})

        [event] = store.read_stream(hostile)
        assert (event.stream_id, event.data) == (hostile, recorded[0].data)
        assert event.data["detail"] == payload
        manifest = get_manifest(store, hostile)
        assert (manifest["skills"], manifest["note"]) == (hostile, hostile)
        assert [r["run_id"] for r in manifest["runs"]] == [hostile]
        with RunLog(store, hostile, register_run=False) as reader:
            [prediction] = reader.predictions()
        assert (prediction["question_id"], prediction["prediction"]) == (hostile, hostile)
        assert read_diagnoses(store, hostile)[hostile]["detail"] == payload
        hit = cache.get(hostile, hostile)
        assert hit is not None and hit.results[0].question_id == hostile
        assert _table_names(store) == tables_before
        assert store.verify_projections() == []


# NUL and lone surrogates are refused on purpose (PostgreSQL cannot store them): tested below.
_NO_NUL = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")


@pytest.fixture(scope="module")
def shared_sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path_factory.mktemp('hyp') / 'trm.db'}") as store:
        yield store


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    stream=st.text(_NO_NUL, min_size=1, max_size=120).filter(lambda s: s.strip() != ""),
    value=st.text(_NO_NUL, max_size=200),
)
def test_any_stream_id_and_text_round_trip_verbatim(
    shared_sqlite_store: Store, stream: str, value: str
) -> None:
    """Invariant: whatever the text, the log returns exactly it (never parsed as SQL)."""
    store = shared_sqlite_store
    head = store.head_position()
    data = {"question_id": "q", "tier": "wrong", "detail": {"v": value, value: stream}}
    store.append(stream, [NewEvent(QUESTION_DIAGNOSED, data)])
    [event] = [e for e in store.read_all(after_position=head) if e.stream_id == stream]
    assert event.data["detail"] == {"v": value, value: stream}
    assert store.read_stream(stream)[-1].position == event.position


@pytest.mark.parametrize("where", ["stream_id", "data"])
def test_lone_surrogate_is_a_typed_validation_error(store_url: str, where: str) -> None:
    bad = "x\ud800y"
    stream = bad if where == "stream_id" else "diagnosis:r1"
    detail = bad if where == "data" else None
    data = {"question_id": "q", "tier": "wrong", "detail": detail}
    with open_store(store_url) as store:
        with pytest.raises(EventValidationError):
            store.append(stream, [NewEvent(QUESTION_DIAGNOSED, data)])
        assert store.head_position() == 0


# -- the API key -------------------------------------------------------------------------------

KEY = "sk-trm-SECRET-" + uuid.uuid4().hex


def _messages_of(exc: BaseException) -> list[str]:
    """Every message and repr along the cause/context chain, `last_error` included."""
    return [t for e in exception_chain(exc) for t in (str(e), repr(e), *map(str, e.args))]


def _log_texts(records: list[logging.LogRecord]) -> list[str]:
    formatter = logging.Formatter()
    return [formatter.format(r) + repr(r.args) + repr(getattr(r, "__dict__", {})) for r in records]


@pytest.fixture
async def shared_redis() -> AsyncIterator[tuple[Redis, str]]:
    client = Redis(host="127.0.0.1", port=6379)
    prefix = f"trmtest:hardening:{uuid.uuid4().hex}"
    yield client, prefix
    names = [name async for name in client.scan_iter(match=f"{prefix}*")]
    if names:
        await client.delete(*names)
    await client.aclose()


def _echo(status_code: int) -> Reply:
    body = {"error": {"message": f"bad header Authorization: Bearer {KEY}", "code": "echo"}}
    return status(status_code, body)


async def _no_sleep(_seconds: float) -> None:
    return None


@pytest.mark.redis
async def test_api_key_reaches_only_the_authorization_header(
    sqlite_url: str, shared_redis: tuple[Redis, str], caplog: pytest.LogCaptureFixture
) -> None:
    redis_client, prefix = shared_redis
    caplog.set_level(logging.DEBUG)  # root: httpx, httpcore, trm_llm.* all propagate here
    for name in ("httpx", "httpcore", "trm_llm", "trm_store", "redis"):
        caplog.set_level(logging.DEBUG, logger=name)  # restored after the test
    errors: list[BaseException] = []
    with open_store(sqlite_url) as store:
        sink = StoreEventSink(store)
        cache = RedisResponseCache(redis_client, ttl_s=600, namespace=f"{prefix}:llm", sink=sink)
        async with SimulatedServer() as server:
            server.script(
                _echo(401),  # fatal at once
                _echo(500),
                _echo(500),
                normal(["one"]),  # retried, then complete
                cut(),
                normal(["two"]),  # a truncated stream, then complete
                _echo(500),
                _echo(503),
                _echo(500),  # retries exhausted
            )
            client = GovernedLLMClient(
                server.base_url,
                "sim",
                api_key=KEY,
                cache=cache,
                breaker=CircuitBreaker(fail_threshold=10),
                retry=RetryPolicy(max_attempts=3),
                sink=sink,
                sleep=_no_sleep,
            )
            async with client:
                for n in range(5):
                    try:
                        await client.chat([{"role": "user", "content": f"q{n}"}], cache_salt="e1")
                    except LLMError as exc:
                        errors.append(exc)
                await client.chat([{"role": "user", "content": "q1"}], cache_salt="e1")  # a hit
        assert server.request_count == 10
        assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
        events = list(store.read_all())
    assert len(errors) == 2  # the 401 and the exhausted 5xx
    texts = [json.dumps({"data": e.data, "meta": e.meta}, default=str) for e in events]
    texts += _log_texts(caplog.records)
    names = [name async for name in redis_client.scan_iter(match=f"{prefix}*")]
    texts += [name.decode() for name in names]
    texts += [str(await redis_client.get(name)) for name in names]
    for error in errors:
        texts += _messages_of(error)
    assert len(names) == 3 and len(events) >= 6
    assert "httpx" in {r.name for r in caplog.records}
    assert any(r.name.startswith("httpcore") for r in caplog.records)
    assert any("***" in t for t in texts)  # the echo was seen and redacted, not dropped unseen
    assert [t for t in texts if KEY in t] == []


async def test_api_key_echoed_in_a_streamed_error_payload_stays_out_of_the_exception() -> None:
    echo = Reply(steps=(sse({"error": {"message": f"Authorization: Bearer {KEY}"}}), sse("[DONE]")))
    async with SimulatedServer() as server:
        server.script(echo, echo)
        async with GovernedLLMClient(
            server.base_url, "sim", api_key=KEY, retry=RetryPolicy(max_attempts=2), sleep=_no_sleep
        ) as client:
            with pytest.raises(LLMError) as info:
                await client.chat(USER)
    assert [t for t in _messages_of(info.value) if KEY in t] == []


# -- Redis key names ---------------------------------------------------------------------------


def _answer(text: str) -> CachedResponse:
    return CachedResponse(content=text, finish_reason="stop", model="sim")


@pytest.mark.redis
async def test_redis_namespaces_and_breaker_keys_never_collide(
    shared_redis: tuple[Redis, str],
) -> None:
    redis_client, prefix = shared_redis
    namespaces = [f"{prefix}:a", f"{prefix}:b", f"{prefix}:a:b"]  # nested: a prefix of the others
    caches = [RedisResponseCache(redis_client, ttl_s=60, namespace=ns) for ns in namespaces]
    key = build_cache_key("sim", USER, "e1")
    for cache in caches:
        assert await cache.set(key, _answer(cache.namespace))
    # A shared breaker in the same namespace as a cache, for a source named like a cache key.
    sync_client = redis.Redis(host="127.0.0.1", port=6379)
    try:
        breaker = CircuitBreaker(
            fail_threshold=1, redis_client=sync_client, namespace=namespaces[0]
        )
        breaker.record_failure(key, now=1000.0)
        assert breaker.admit(key, now=10_000.0).allowed  # the probe lease is taken too
    finally:
        sync_client.close()
    names = sorted([n.decode() async for n in redis_client.scan_iter(match=f"{prefix}*")])
    assert names == sorted(
        [
            f"{prefix}:a:{key}",
            f"{prefix}:b:{key}",
            f"{prefix}:a:b:{key}",
            f"{prefix}:a:{key}:state",
            f"{prefix}:a:{key}:probe",
        ]
    )
    for cache in caches:
        hit = await cache.get(key)
        assert hit is not None and hit.content == cache.namespace
        raw = await redis_client.get(cache.redis_key(key))
        assert raw is not None and decode_entry(raw).content == cache.namespace
