"""LLM call events on `llm:{source}` and their read models, on SQLite and PostgreSQL.

The payloads are the ones `trm_llm/sink.py` documents; the last tests drive the real governed
client and the real SQLite cache through `StoreEventSink`, so a drift between what trm_llm emits
and what the store accepts fails here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from trm_llm.cache import CachedResponse, build_cache_key
from trm_llm.client import GovernedLLMClient
from trm_llm.simulated_server import SimulatedServer, cut, normal
from trm_llm.sink import StoreEventSink
from trm_llm.sqlite_cache import SqliteResponseCache
from trm_store import EventValidationError, Store, open_store
from trm_store.domain.errors import UnknownCallError
from trm_store.domain.llm_calls import (
    breaker_transitions,
    cache_problems,
    llm_call,
    llm_calls,
    llm_stats,
)

KEY = build_cache_key("m", [{"role": "user", "content": "hi"}])


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as s:
        yield s


def attempt(n: int, outcome: str = "ok", reason: str | None = None, **kw: Any) -> dict[str, Any]:
    base = {"status": 200, "latency_ms": 12.5, "tokens_discarded": 0, "sleep_s": None}
    return {"n": n, "outcome": outcome, "reason": reason, **base, **kw}


def completed(call_id: str = "c1", **kw: Any) -> dict[str, Any]:
    data = {
        "call_id": call_id,
        "parent_call_id": None,
        "model": "m",
        "endpoint": "http://127.0.0.1:8765/v1",
        "profile": "strict",
        "cache": "miss",
        "cache_salt": "run7:e2",
        "cache_write": "written",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        "ttft_ms": 40.0,
        "max_inter_token_ms": 9.5,
        "latency_ms": 250.0,
        "attempts": [
            attempt(1, "retry", "truncated_no_done", tokens_discarded=3, sleep_s=0.4),
            attempt(2),
        ],
    }
    return {**data, **kw}


def failed(call_id: str = "f1", **kw: Any) -> dict[str, Any]:
    data = {
        "call_id": call_id,
        "parent_call_id": "parent",
        "model": "m",
        "endpoint": "http://127.0.0.1:8765/v1",
        "profile": "strict",
        "cache": "off",
        "cache_salt": None,
        "latency_ms": 900.0,
        "attempts": [
            attempt(1, "retry", "http_503", status=503, sleep_s=0.1),
            attempt(2, "retry", "ReadError", status=None, tokens_discarded=2, sleep_s=0.2),
            attempt(3, "failed", "http_503", status=503),
        ],
        "error": "retries_exhausted",
        "reason": "http_503",
        "status": 503,
        "detail": "gave up after 3 attempt(s)",
    }
    return {**data, **kw}


def test_a_completed_call_is_one_row(store: Store) -> None:
    StoreEventSink(store).emit("gpt", "call_completed", completed())
    row = llm_call(store, "c1")
    assert row["source"] == "gpt" and row["outcome"] == "completed"
    assert (row["cache"], row["cache_hit"], row["cache_salt"]) == ("miss", False, "run7:e2")
    assert (row["attempts"], row["attempt_reasons"], row["tokens_discarded"]) == (
        2,
        ["truncated_no_done"],
        3,
    )
    assert (row["prompt_tokens"], row["completion_tokens"], row["total_tokens"]) == (5, 7, 12)
    assert (row["latency_ms"], row["ttft_ms"], row["finish_reason"]) == (250.0, 40.0, "stop")
    assert row["position"] == store.head_position()
    assert store.read_stream("llm:gpt")[0].type == "llm.call_completed"


def test_a_cache_hit_has_no_attempts(store: Store) -> None:
    hit = completed(cache="hit", cache_write=None, attempts=[], ttft_ms=None, usage=None)
    StoreEventSink(store).emit("gpt", "call_completed", hit)
    row = llm_call(store, "c1")
    assert (row["cache_hit"], row["attempts"], row["status"], row["total_tokens"]) == (
        True,
        0,
        None,
        None,
    )


def test_a_failed_call_keeps_every_attempt_reason(store: Store) -> None:
    StoreEventSink(store).emit("gpt", "call_failed", failed())
    row = llm_call(store, "f1")
    assert (row["outcome"], row["error"], row["reason"], row["status"]) == (
        "failed",
        "retries_exhausted",
        "http_503",
        503,
    )
    assert row["attempt_reasons"] == ["http_503", "ReadError", "http_503"]
    assert (row["attempts"], row["tokens_discarded"], row["finish_reason"]) == (3, 2, None)


def test_unknown_call_is_a_typed_error(store: Store) -> None:
    with pytest.raises(UnknownCallError):
        llm_call(store, "nope")


def test_breaker_transitions_per_source_in_order(store: Store) -> None:
    sink = StoreEventSink(store)
    for source, old, new in [
        ("gpt", "closed", "open"),
        ("other", "closed", "open"),
        ("gpt", "open", "half_open"),
        ("gpt", "half_open", "closed"),
    ]:
        data = {"from_state": old, "to_state": new, "failures": 5, "at": 10.0, "call_id": "c"}
        sink.emit(source, "breaker_changed", data)
    path = [(t["from_state"], t["to_state"]) for t in breaker_transitions(store, source="gpt")]
    assert path == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    assert len(breaker_transitions(store)) == 4
    assert llm_stats(store)["other"]["breaker_opened"] == 1


def test_stats_per_source(store: Store) -> None:
    sink = StoreEventSink(store)
    sink.emit("gpt", "call_completed", completed("c1"))
    sink.emit("gpt", "call_completed", completed("c2", cache="hit", attempts=[], cache_write=None))
    sink.emit("gpt", "call_failed", failed("f1"))
    gpt = llm_stats(store)["gpt"]
    assert (gpt["calls"], gpt["completed"], gpt["failed"], gpt["cache_hits"]) == (3, 2, 1, 1)
    assert (gpt["attempts"], gpt["retries"]) == (5, 3)
    assert gpt["errors"] == {"retries_exhausted": 1}
    assert gpt["attempt_reasons"] == {"truncated_no_done": 1, "http_503": 2, "ReadError": 1}


@pytest.mark.parametrize(
    ("event_type", "data"),
    [
        ("call_completed", {**completed(), "authorization": "Bearer sk-123"}),
        ("call_completed", completed(latency_ms=float("nan"))),
        ("call_completed", completed(latency_ms=-1.0)),
        ("call_completed", completed(cache="maybe")),
        ("call_completed", {k: v for k, v in completed().items() if k != "call_id"}),
        ("call_completed", completed(attempts=[attempt(0)])),
        ("call_failed", failed(error="oops")),
        ("call_failed", failed(cache="hit")),
        ("breaker_changed", {"from_state": "shut", "to_state": "open", "failures": 1}),
        (
            "cache_corrupt",
            {
                "backend": "redis",
                "namespace": "n",
                "key": "what is 2+2",
                "detail": "",
                "reason": "bad_json",
            },
        ),
    ],
)
def test_a_payload_off_the_documented_shape_is_refused(
    store: Store, event_type: str, data: dict[str, Any]
) -> None:
    with pytest.raises(EventValidationError):
        StoreEventSink(store).emit("gpt", event_type, data)
    assert store.head_position() == 0


def test_rebuild_reproduces_the_read_models(store: Store) -> None:
    sink = StoreEventSink(store)
    sink.emit("gpt", "call_completed", completed("c1"))
    sink.emit("gpt", "call_failed", failed("f1"))
    sink.emit(
        "gpt",
        "breaker_changed",
        {"from_state": "closed", "to_state": "open", "failures": 5, "at": 1.0, "call_id": "f1"},
    )
    before = (llm_calls(store), breaker_transitions(store))
    assert store.rebuild_projections(only=["llm_calls"]) == {"llm_calls": 3}
    assert (llm_calls(store), breaker_transitions(store)) == before
    assert store.verify_projections() == []


async def test_cache_problems_from_a_real_cache(store: Store, tmp_path: Path) -> None:
    sink = StoreEventSink(store)
    broken = SqliteResponseCache(tmp_path, ttl_s=60, sink=sink)  # a directory: unwritable
    assert (
        await broken.set(KEY, CachedResponse(content="x", finish_reason="stop", model="m")) is False
    )
    await sink.flush()  # the cache emits on the loop: its event is written off it
    [problem] = cache_problems(store)
    assert (problem["kind"], problem["backend"], problem["key"]) == (
        "cache_write_failed",
        "sqlite",
        KEY,
    )
    assert problem["cause"] == "OperationalError"
    assert store.read_stream("llm:cache")[0].type == "llm.cache_write_failed"


@pytest.fixture
async def server() -> AsyncIterator[SimulatedServer]:
    async with SimulatedServer() as srv:
        yield srv


async def test_the_governed_client_records_every_call(
    store: Store, server: SimulatedServer, tmp_path: Path
) -> None:
    sink = StoreEventSink(store)
    cache = SqliteResponseCache(tmp_path / "cache.db", ttl_s=60, sink=sink)

    async def no_sleep(seconds: float) -> None:
        return None

    client = GovernedLLMClient(
        server.base_url, "sim", cache=cache, sink=sink, sleep=no_sleep, source="sim"
    )
    async with client:
        server.script(cut(after=2), normal(["hi"]), normal(["again"]))
        user = [{"role": "user", "content": "Say hello."}]
        first = await client.chat(user, cache_salt="run:e1")
        again = await client.chat(user, cache_salt="run:e1")  # same epoch: a hit
        other = await client.chat(user, cache_salt="run:e2")  # next epoch: re-sampled
    assert (first.cached, again.cached, other.cached) == (False, True, False)
    rows = llm_calls(store, source="sim")
    assert [(r["call_id"], r["cache"]) for r in rows] == [
        (first.call_id, "miss"),
        (again.call_id, "hit"),
        (other.call_id, "miss"),
    ]
    assert rows[0]["attempt_reasons"] == ["truncated_no_done"]
    assert rows[0]["cache_write"] == "written" and rows[0]["tokens_discarded"] == 2
    assert [r["cache_salt"] for r in rows] == ["run:e1", "run:e1", "run:e2"]
    assert llm_stats(store)["sim"]["attempt_reasons"] == {"truncated_no_done": 1}
