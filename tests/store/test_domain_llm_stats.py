"""`llm_stats`, the one aggregation of LLM calls: it equals a plain count over the payloads the
sink was given, for every source, after any position, and names what it does not know."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store.test_llm_calls import attempt, completed, failed
from trm_llm.sink import StoreEventSink
from trm_store import DomainInputError, NewEvent, open_store
from trm_store.domain.errors import UnknownLLMSourceError
from trm_store.domain.llm_calls import llm_stats, percentile

REASONS = ("truncated_no_done", "http_500", "stall_inter_token", "ReadError")


@st.composite
def a_call(draw: st.DrawFn, n: int) -> tuple[str, dict[str, Any]]:
    """One call_completed / call_failed payload with random attempts, cache and salt."""
    retries = [
        attempt(
            i + 1,
            "retry",
            draw(st.sampled_from(REASONS)),
            tokens_discarded=draw(st.integers(0, 3)),
            overload=draw(st.booleans()),
        )
        for i in range(draw(st.integers(0, 2)))
    ]
    counts = st.none() | st.integers(0, 500)
    usage = draw(
        st.none()
        | st.fixed_dictionaries(
            {},
            optional={"prompt_tokens": counts, "completion_tokens": counts, "total_tokens": counts},
        )
    )
    salt = draw(st.sampled_from([None, "arm-a", "arm-b"]))
    latency = draw(st.floats(0, 5000, allow_nan=False))
    if draw(st.booleans()):
        hit = draw(st.booleans())
        data = completed(
            f"c{n}",
            cache="hit" if hit else "miss",
            cache_write=None if hit else "written",
            cache_salt=salt,
            attempts=[] if hit else [*retries, attempt(len(retries) + 1)],
            finish_reason=draw(st.sampled_from(["stop", "length"])),
            ttft_ms=draw(st.none() | st.floats(0, 1000, allow_nan=False)),
            latency_ms=latency,
            usage=usage,
        )
        return "call_completed", data
    error = draw(st.sampled_from(["retries_exhausted", "circuit_open", "fatal"]))
    last = attempt(len(retries) + 1, "failed", "http_503", status=503)
    data = failed(
        f"f{n}", cache_salt=salt, error=error, attempts=[*retries, last], latency_ms=latency
    )
    return "call_failed", data


def _tokens(payloads: list[dict[str, Any]]) -> dict[str, int]:
    """Usage of the answers a server sent, summed the plain way (None counts as absent)."""
    out = {"calls": 0, "prompt": 0, "completion": 0, "total": 0}
    for d in payloads:
        usage = {k: v for k, v in (d.get("usage") or {}).items() if v is not None}
        if d["cache"] == "hit" or not usage:
            continue
        prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        out["calls"] += 1
        out["prompt"] += prompt
        out["completion"] += completion
        out["total"] += usage.get("total_tokens", prompt + completion)
    return out


def _limit(moves: list[tuple[int, int]]) -> dict[str, Any]:
    path = [moves[0][0], *(to for _, to in moves)] if moves else []
    return {
        "changes": len(moves),
        "shrank": sum(to < fro for fro, to in moves),
        "current": path[-1] if path else None,
        "min": min(path) if path else None,
        "max": max(path) if path else None,
        "path": path,
    }


def expected(
    calls: list[tuple[str, str, dict[str, Any]]],
    opened: Counter[str],
    moves: dict[str, list[tuple[int, int]]] | None = None,
) -> dict[str, Any]:
    """The figures counted the plain way, straight from the payloads."""
    moves = moves or {}
    out: dict[str, Any] = {}
    for source in sorted({s for s, _, _ in calls} | set(opened) | set(moves)):
        mine = [(t, d) for s, t, d in calls if s == source]
        done = [d for t, d in mine if t == "call_completed"]
        fetched = [d for d in done if d["cache"] != "hit"]
        reasons = Counter(
            a["reason"] for _, d in mine for a in d["attempts"] if a["outcome"] != "ok"
        )
        hits = sum(d["cache"] == "hit" for _, d in mine)
        salts: dict[str | None, dict[str, Any]] = {}
        for t, d in mine:
            salt = salts.setdefault(d["cache_salt"], {"calls": 0, "cache_hits": 0, "failed": 0})
            salt["calls"] += 1
            salt["cache_hits"] += d["cache"] == "hit"
            salt["failed"] += t == "call_failed"
        for name, salt in salts.items():
            salt["tokens"] = _tokens([d for d in done if d["cache_salt"] == name])
        last = [
            f"{d['reason']}: {d['detail']}"
            for t, d in mine
            if t == "call_failed" and d["error"] != "circuit_open"
        ]
        latencies = [d["latency_ms"] for d in fetched]
        ttfts = [d["ttft_ms"] for d in fetched if d["ttft_ms"] is not None]
        out[source] = {
            "calls": len(mine),
            "completed": len(done),
            "failed": len(mine) - len(done),
            "errors": dict(Counter(d["error"] for t, d in mine if t == "call_failed")),
            "cache_hits": hits,
            "cache_hit_rate": hits / len(mine) if mine else None,
            "attempts": sum(len(d["attempts"]) for _, d in mine),
            "retries": sum(max(len(d["attempts"]) - 1, 0) for _, d in mine),
            "attempt_reasons": dict(reasons),
            "truncated_streams": reasons["truncated_no_done"],
            "length_finishes": sum(d["finish_reason"] == "length" for d in done),
            "tokens_discarded": sum(a["tokens_discarded"] for _, d in mine for a in d["attempts"]),
            "overload_retries": sum(
                bool(a.get("overload")) for _, d in mine for a in d["attempts"]
            ),
            "last_error": last[-1] if last else None,
            "tokens": _tokens(done),
            "limit": _limit(moves.get(source, [])),
            "breaker_opened": opened[source],
            "latency_ms": {
                "n": len(latencies),
                "p50": percentile(latencies, 50),
                "p95": percentile(latencies, 95),
            },
            "ttft_ms": {
                "n": len(ttfts),
                "p50": percentile(ttfts, 50),
                "p95": percentile(ttfts, 95),
            },
            "by_salt": salts,
        }
    return out


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_stats_equal_a_plain_count_of_what_was_emitted(
    sqlite_url: str, data: st.DataObject
) -> None:
    fresh = sqlite_url.removesuffix(".db") + f"-{uuid.uuid4().hex}.db"  # one per example
    with open_store(fresh) as store:
        sink = StoreEventSink(store)
        before = []  # recorded before `after`: never counted after it
        for source, event_type, payload in [("old", *data.draw(a_call(0)))]:
            payload = {**payload, "call_id": f"{store.head_position()}-old"}
            sink.emit(source, event_type, payload)
            before.append((source, event_type, payload))
        after = store.head_position()
        sources = st.sampled_from(["old", "a", "b"])
        calls = []
        for n in range(data.draw(st.integers(0, 12))):
            source, (event_type, payload) = data.draw(sources), data.draw(a_call(n))
            payload = {**payload, "call_id": f"{after}-{n}"}  # unique across examples
            sink.emit(source, event_type, payload)
            calls.append((source, event_type, payload))
        # A call recorded again (its row replaced) counts once, as recorded last.
        for again in data.draw(st.lists(st.integers(0, 11), max_size=2)) if calls else []:
            call_id = calls[again % len(calls)][2]["call_id"]
            source, (event_type, payload) = data.draw(sources), data.draw(a_call(again))
            payload = {**payload, "call_id": call_id}
            sink.emit(source, event_type, payload)
            calls = [c for c in calls if c[2]["call_id"] != call_id]
            calls.append((source, event_type, payload))
        opened = Counter(data.draw(st.lists(sources, max_size=3)))
        for source in opened.elements():
            change = {"from_state": "closed", "to_state": "open", "failures": 5, "at": 1.0}
            sink.emit(source, "breaker_changed", {**change, "call_id": None})
        moves: dict[str, list[tuple[int, int]]] = {}
        for source in data.draw(st.lists(sources, max_size=4)):
            fro, to = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 8))
            change = {"from_limit": fro, "to_limit": to, "in_flight": 1, "ceiling": 8}
            cause = "overload" if to < fro else "success"
            reason = "RemoteProtocolError" if cause == "overload" else None
            sink.emit(
                source,
                "limit_changed",
                {**change, "cause": cause, "reason": reason, "call_id": f"{after}-lim"},
            )
            moves.setdefault(source, []).append((fro, to))
        assert llm_stats(store, after=after) == expected(calls, opened, moves)
        # Over every call (the projection's running totals, not the rows): the same count.
        assert llm_stats(store) == expected(before + calls, opened, moves)
        for source in {"old"} | {c[0] for c in calls}:
            assert llm_stats(store, source=source) == {
                source: expected(before + calls, opened, moves)[source]
            }
        known = {"old"} | {c[0] for c in calls} | set(opened) | set(moves)
        for source in known:  # every known source
            one = llm_stats(store, source=source, after=after)
            assert list(one) == [source]
            theirs = [c for c in calls if c[0] == source]
            # A source known from earlier but silent since `after` is all zeros.
            mine = {source: moves.get(source, [])}
            assert one[source] == expected(theirs, Counter({source: opened[source]}), mine)[source]


def test_a_source_without_events_is_a_typed_error_naming_the_known_ones(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        StoreEventSink(store).emit("gpt", "call_completed", completed())
        with pytest.raises(UnknownLLMSourceError, match=r"source 'nope' \(known: gpt\)"):
            llm_stats(store, source="nope")
        # Known, but nothing after the position: zeros, not an error.
        assert llm_stats(store, source="gpt", after=store.head_position())["gpt"]["calls"] == 0
        with pytest.raises(DomainInputError):
            llm_stats(store, after=-1)
        with pytest.raises(DomainInputError):
            llm_stats(store, source="")


def test_store_is_not_written_by_the_query(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        StoreEventSink(store).emit("gpt", "call_completed", completed())
    with open_store(sqlite_url, read_only=True) as store:
        head = store.head_position()
        assert llm_stats(store)["gpt"]["calls"] == 1
        assert store.head_position() == head


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_totals_kept_batch_by_batch_equal_a_rebuild(sqlite_url: str, data: st.DataObject) -> None:
    # Batches of up to 20 calls (the projection looks their ids up in padded IN lists of 1 to
    # 32) whose ids repeat within a batch and across batches: each recorded again replaces
    # its row, and the running totals must equal the ones a rebuild counts from scratch.
    fresh = sqlite_url.removesuffix(".db") + f"-{uuid.uuid4().hex}.db"
    with open_store(fresh) as store:
        for _ in range(data.draw(st.integers(1, 6))):
            batch = []
            for n in range(data.draw(st.integers(1, 20))):
                event_type, payload = data.draw(a_call(n))
                payload = {**payload, "call_id": f"c{data.draw(st.integers(0, 24))}"}
                batch.append(NewEvent(f"llm.{event_type}", payload))
            store.append_batch([("llm:a", batch, None)])
        kept = llm_stats(store)
        store.rebuild_projections("llm_calls")
        assert llm_stats(store) == kept
