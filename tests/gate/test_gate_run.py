"""Gate.run against a real store (SQLite file and PostgreSQL): baseline INFRA never cached, the
guard runs before caching, the cache is reused across gates, events, and the I/O loop decides
exactly what the pure core decides on the same outcomes."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import pytest

from tests.gate.arms import ERROR, OK, WRONG, TableArm, table, units
from trm_gate import (
    Arm,
    ArmResultError,
    BlockPairing,
    Gate,
    GateConfig,
    GateInputError,
    GateStateError,
    QuestionResult,
    fold_units,
    pair_block,
    run_blocks,
)
from trm_store import Store, open_store
from trm_store.domain.baseline import BaselineCache
from trm_store.domain.gates import gate_blocks, gate_info, gate_stream


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[Store]:
    with open_store(sqlite_url) as s:
        yield s


async def test_baseline_infra_unit_is_not_cached_nor_counted(store: Store) -> None:
    """Seed task 6: a baseline unit ending in `error` is not in the cache after the block."""
    pool = units(10)
    base = table(pool, OK, u000=ERROR)
    cand = table(pool, OK)
    result = await Gate(store, block_size=10).run(
        "g1", pool, baseline=Arm("base@1", base), candidate=Arm("cand@1", cand), seed=1
    )
    cache = BaselineCache(store)
    assert cache.get("base@1", "u000") is None
    assert all(cache.get("base@1", u) is not None for u in pool[1:])
    assert result.infra_units_baseline == 1 and result.infra_units_candidate == 0
    # Had the INFRA unit been scored as a wrong answer, the candidate would have won it.
    assert (result.wins, result.losses, result.ties) == (0, 0, 9)
    assert result.verdict == "inconclusive"


async def test_a_block_that_trips_the_guard_caches_nothing(store: Store) -> None:
    pool = units(20)
    order_seed = 0
    order = pool.copy()
    random.Random(order_seed).shuffle(order)
    base = table(pool, OK, **{u: ERROR for u in order[:8]})  # 8 of the first block's 10
    cand = table(pool, WRONG)
    result = await Gate(store, block_size=10).run(
        "g1", pool, baseline=Arm("base@1", base), candidate=Arm("cand@1", cand), seed=order_seed
    )
    assert result.verdict == "infra_abort" and "baseline INFRA rate 8/10" in result.reason
    assert result.blocks == 1 and result.units_evaluated == 10
    cache = BaselineCache(store)
    assert [u for u in pool if cache.get("base@1", u) is not None] == []
    types = [e.type for e in store.read_stream(gate_stream("g1"))]
    assert types == ["gate.started", "gate.block_evaluated", "gate.decided"]
    assert gate_blocks(store, "g1")[0]["decision"] == "infra_abort"


async def test_candidate_infra_well_above_baseline_aborts(sqlite_store: Store) -> None:
    pool = units(20)
    base = table(pool, OK)
    cand = table(pool, OK, **{u: ERROR for u in pool[:8]})  # 8 candidate-only INFRA units of 20
    result = await Gate(sqlite_store, block_size=20).run(
        "g1", pool, baseline=Arm("base@1", base), candidate=Arm("cand@1", cand), seed=3
    )
    assert result.verdict == "infra_abort" and "above the baseline" in result.reason
    assert BaselineCache(sqlite_store).get("base@1", pool[5]) is None


async def test_second_gate_on_the_same_baseline_snapshot_reuses_the_cache(store: Store) -> None:
    pool = units(40)
    order2 = pool.copy()
    random.Random(6).shuffle(order2)
    flaky = order2[0]  # in the second gate's first block
    base = table(pool, WRONG, **{flaky: ERROR})  # one INFRA unit: 1/10 in its block, tolerated
    first = await Gate(store, block_size=10).run(
        "g1", pool, baseline=Arm("base@1", base), candidate=Arm("a", table(pool, WRONG)), seed=5
    )
    assert first.verdict == "inconclusive" and first.units_evaluated == 40
    assert first.baseline_cache_hits == 0
    second = await Gate(store, block_size=10).run(
        "g2", pool, baseline=Arm("base@1", base), candidate=Arm("b", table(pool, OK)), seed=6
    )
    assert second.verdict == "accept" and second.units_evaluated < 40
    evaluated = base.evaluated
    assert sorted(u for u in evaluated if u != flaky) == sorted(set(pool) - {flaky})  # once each
    assert evaluated.count(flaky) == 2  # INFRA was never cached, so it is evaluated again
    assert second.baseline_cache_hits == second.units_evaluated - 1
    assert gate_info(store, "g2")["baseline_cache_hits"] == second.baseline_cache_hits


async def test_events_and_projection_record_the_run(store: Store) -> None:
    pool = units(45)
    rng = random.Random(7)
    base = TableArm({u: [(rng.random() < 0.5, "stop")] for u in pool})
    cand = TableArm({u: [(rng.random() < 0.5, "stop")] for u in pool})
    result = await Gate(store, block_size=20, max_pairs=None).run(
        "g-ev", pool, baseline=Arm("b@1", base), candidate=Arm("c@1", cand), seed=42
    )
    events = store.read_stream(gate_stream("g-ev"))
    assert events[0].type == "gate.started"
    assert events[0].data["seed"] == 42 and events[0].data["pool_size"] == 45
    assert events[0].data["config"]["block_size"] == 20
    assert events[-1].type == "gate.decided" and events[-1].data["verdict"] == result.verdict
    blocks = gate_blocks(store, "g-ev")
    assert len(blocks) == result.blocks
    assert sum(b["wins"] for b in blocks) == result.wins
    assert sum(b["losses"] for b in blocks) == result.losses
    order = pool.copy()
    random.Random(42).shuffle(order)
    assert [u for b in blocks for u in b["unit_ids"]] == order[: result.units_evaluated]
    info = gate_info(store, "g-ev")
    assert info["status"] == "decided" and info["verdict"] == result.verdict
    assert (info["wins"], info["losses"], info["ties"]) == (result.wins, result.losses, result.ties)
    assert info["units_evaluated"] == result.units_evaluated
    assert info["baseline_snapshot"] == "b@1" and info["seed"] == 42
    assert store.verify_projections() == []


async def test_gate_run_decides_exactly_what_the_pure_core_decides(store: Store) -> None:
    pool = units(120)
    rng = random.Random(11)

    def arm(p: float) -> TableArm:
        return TableArm(
            {
                u: [(rng.random() < p, "stop") for _ in range(rng.randint(1, 3))]
                if rng.random() > 0.03
                else [ERROR]
                for u in pool
            }
        )

    base, cand = arm(0.5), arm(0.7)
    gate = Gate(store, block_size=15, infra_max_rate=0.5)
    result = await gate.run(
        "g-fid", pool, baseline=Arm("b", base), candidate=Arm("c", cand), seed=9
    )
    order = pool.copy()
    random.Random(9).shuffle(order)

    def pairings() -> Iterator[BlockPairing]:
        for i in range(0, len(order), 15):
            ids = order[i : i + 15]
            yield pair_block(fold_units(base.results(ids), ids), fold_units(cand.results(ids), ids))

    pure = run_blocks(GateConfig(block_size=15, infra_max_rate=0.5), pairings())
    assert (result.verdict, result.wins, result.losses, result.ties) == (
        pure.verdict,
        pure.wins,
        pure.losses,
        pure.ties,
    )
    assert (result.e_value, result.futility_e_value) == (pure.e_value, pure.futility_e_value)
    assert result.infra_units_baseline == pure.infra_baseline


async def test_accept_stops_early_and_records_the_decision(sqlite_store: Store) -> None:
    pool = units(100)
    result = await Gate(sqlite_store).run(
        "g-acc", pool, baseline=Arm("b", table(pool, WRONG)), candidate=Arm("c", table(pool, OK))
    )
    assert result.verdict == "accept" and result.blocks == 1 and result.units_evaluated == 20
    assert result.e_value >= 20
    started = sqlite_store.read_stream(gate_stream("g-acc"))[0]
    assert started.data["seed"] == result.seed  # a random seed is still recorded


@pytest.mark.parametrize(
    ("unit_ids", "kwargs", "match"),
    [
        ([], {}, "empty"),
        (["a", "b", "a"], {}, "more than once"),
        (["a", ""], {}, "unit id"),
        ("abc", {}, "sequence"),
        (["a"], {"seed": -1}, "seed"),
        (["a"], {"seed": 2**63}, "seed"),
    ],
)
async def test_bad_input_writes_nothing(
    sqlite_store: Store, unit_ids: object, kwargs: dict[str, object], match: str
) -> None:
    arm = Arm("b", table(["a", "b"], OK))
    with pytest.raises(GateInputError, match=match):
        await Gate(sqlite_store).run("g", unit_ids, baseline=arm, candidate=arm, **kwargs)  # type: ignore[arg-type]
    assert sqlite_store.head_position() == 0


@pytest.mark.parametrize(
    "kwargs",
    [{"alpha": 1.5}, {"beta": 0.0}, {"p1": 0.5}, {"block_size": 0}, {"infra_min_units": 0}],
)
def test_bad_gate_parameters_are_refused(sqlite_store: Store, kwargs: dict[str, object]) -> None:
    with pytest.raises(GateInputError):
        Gate(sqlite_store, **kwargs)  # type: ignore[arg-type]


def test_bad_arm_is_refused() -> None:
    with pytest.raises(GateInputError):
        Arm("", table(["a"], OK))
    with pytest.raises(GateInputError):
        Arm("s", "not callable")  # type: ignore[arg-type]


async def test_a_gate_id_cannot_be_reused(sqlite_store: Store) -> None:
    pool = units(5)
    arm = Arm("b", table(pool, OK))
    await Gate(sqlite_store).run("g", pool, baseline=arm, candidate=arm, seed=1)
    head = sqlite_store.head_position()
    with pytest.raises(GateStateError, match="events already"):
        await Gate(sqlite_store).run("g", pool, baseline=arm, candidate=arm, seed=1)
    assert sqlite_store.head_position() == head


async def test_an_arm_failure_propagates_and_caches_nothing_for_that_block(
    sqlite_store: Store,
) -> None:
    pool = units(20)
    base = table(pool, OK)
    cand = table(pool, OK)
    cand.fail_on_call = 2
    with pytest.raises(RuntimeError, match="provider down"):
        await Gate(sqlite_store, block_size=10).run(
            "g", pool, baseline=Arm("b", base), candidate=Arm("c", cand), seed=2
        )
    cache = BaselineCache(sqlite_store)
    second_block = base.calls[1]
    assert [u for u in second_block if cache.get("b", u) is not None] == []
    assert all(cache.get("b", u) is not None for u in base.calls[0])
    info = gate_info(sqlite_store, "g")
    assert info["status"] == "failed" and info["blocks"] == 1
    assert "provider down" in info["reason"]
    assert sqlite_store.read_stream("gate:g")[-1].data["block"] == 2


async def test_answers_for_the_wrong_units_are_refused(sqlite_store: Store) -> None:
    pool = units(4)

    async def sloppy(unit_ids: Sequence[str]) -> list[QuestionResult]:
        return [QuestionResult("q", unit_ids[0], True, "stop")]

    with pytest.raises(ArmResultError, match="no result for unit"):
        await Gate(sqlite_store).run(
            "g", pool, baseline=Arm("b", table(pool, OK)), candidate=Arm("c", sloppy), seed=1
        )
    assert all(BaselineCache(sqlite_store).get("b", u) is None for u in pool)
