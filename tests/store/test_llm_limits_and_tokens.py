"""The concurrency limit's changes and the token totals, from the real client's events to the
figures `trm llm-stats` and the demo show: limit path per source (`llm.limit_changed`, projected
and rebuilt the same), tokens per source and salt, per run, per arm and per gate."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from trm_gate import Arm, Gate, QuestionResult
from trm_llm import ConcurrencyLimiter, GovernedLLMClient, StoreEventSink
from trm_llm.simulated_server import SimulatedServer, normal
from trm_store import RunLog, Store, cli, open_store
from trm_store.domain.errors import UnknownGateError
from trm_store.domain.llm_calls import limit_changes, llm_calls, llm_stats, token_totals


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as s:
        yield s


async def test_limit_changes_are_events_and_llm_stats_shows_the_path(store: Store) -> None:
    sink = StoreEventSink(store)
    limiter = ConcurrencyLimiter(6, ceiling=8)
    server = SimulatedServer(normal(["t"] * 3, delay_s=0.005), max_in_flight=2)
    async with server:
        client = GovernedLLMClient(
            server.base_url, "sim", source="slots2", limiter=limiter, sink=sink
        )
        async with client:
            await asyncio.gather(
                *(client.chat([{"role": "user", "content": f"q{i}"}]) for i in range(30))
            )
    moves = limit_changes(store, source="slots2")
    assert moves and moves[0]["from_limit"] == 6 and moves[0]["cause"] == "overload"
    stats = llm_stats(store, source="slots2")["slots2"]
    limit = stats["limit"]
    assert limit["path"] == [6] + [m["to_limit"] for m in moves]
    assert limit["current"] == limiter.limit and limit["max"] == 6 and limit["min"] >= 1
    assert limit["shrank"] == sum(m["to_limit"] < m["from_limit"] for m in moves) >= 1
    assert stats["completed"] == 30 and stats["overload_retries"] == server.overloaded
    assert stats["breaker_opened"] == 0
    before = llm_stats(store)
    assert store.verify_projections() == []
    store.rebuild_projections(only=["llm_calls"])
    assert llm_stats(store) == before


async def _gate_with_llm_arms(store: Store, server: SimulatedServer) -> None:
    """A real gate whose arms ask the governed client, as the demo's do: each arm is a run whose
    config names the gate and the arm, each prediction names its call."""
    sink = StoreEventSink(store)
    units = [f"u{i}" for i in range(8)]
    async with GovernedLLMClient(server.base_url, "sim", source="tok", sink=sink) as client:
        with (
            RunLog(store, "g1-base", config={"gate_id": "g1", "arm": "baseline"}) as base,
            RunLog(store, "g1-cand", config={"gate_id": "g1", "arm": "candidate"}) as cand,
        ):

            def arm(log: RunLog, salt: str) -> Arm:
                async def evaluate(unit_ids: Sequence[str]) -> list[QuestionResult]:
                    out = []
                    for u in unit_ids:
                        r = await client.chat([{"role": "user", "content": u}], cache_salt=salt)
                        log.record_prediction(
                            f"{u}-q", unit_id=u, prediction="x", correct=True,
                            stop_reason="stop", call_id=r.call_id,
                        )  # fmt: skip
                        out.append(QuestionResult(f"{u}-q", u, True, "stop"))
                    return out

                return Arm(salt, evaluate)

            gate = Gate(store, block_size=4)
            await gate.run("g1", units, baseline=arm(base, "b"), candidate=arm(cand, "c"))


async def test_token_totals_per_run_arm_and_gate(store: Store) -> None:
    async with SimulatedServer(normal(["a", "b"])) as server:  # usage: 5 prompt + 2 completion
        await _gate_with_llm_arms(store, server)
    totals = token_totals(store, gate_id="g1")
    assert [(r["run_id"], r["arm"]) for r in totals["runs"]] == [
        ("g1-base", "baseline"),
        ("g1-cand", "candidate"),
    ]
    answers = len(llm_calls(store, source="tok"))
    per_run = [r["tokens"] for r in totals["runs"]]
    assert sum(t["calls"] for t in per_run) == totals["total"]["calls"] == answers
    assert totals["total"] == {
        "calls": answers,
        "prompt": 5 * answers,
        "completion": 2 * answers,
        "total": 7 * answers,
    }
    assert llm_stats(store, source="tok")["tok"]["tokens"] == totals["total"]  # one aggregation
    by_salt = llm_stats(store, source="tok")["tok"]["by_salt"]
    assert [by_salt[s]["tokens"] for s in ("b", "c")] == per_run
    only = token_totals(store, run_ids=["g1-cand"])
    assert only["gate_id"] is None and only["total"] == per_run[1]
    with pytest.raises(UnknownGateError):
        token_totals(store, gate_id="no-such-gate")


async def test_trm_llm_stats_prints_tokens_and_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'trm.db'}"
    with open_store(url) as store:
        async with SimulatedServer(normal(["a", "b"])) as server:
            await _gate_with_llm_arms(store, server)
    assert cli.main(["llm-stats", "--db", url, "--gate", "g1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tokens"]["total"]["total"] == doc["sources"]["tok"]["tokens"]["total"] > 0
    assert doc["sources"]["tok"]["concurrency_limit"]["path"] == []
    assert cli.main(["llm-stats", "--db", url, "--gate", "g1", "--run", "g1-base"]) == 0
    out = capsys.readouterr().out
    assert "run g1-base (baseline): tokens" in out and "gate g1: tokens" in out
