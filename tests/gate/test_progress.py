"""`Gate.run(progress=...)` (issue 17 point 7): one `GateProgress` per recorded block, in order,
agreeing with the recorded blocks and ending with the verdict."""

from __future__ import annotations

import pytest

from tests.gate.arms import OK, WRONG, table, units
from trm_gate import Arm, Gate, GateInputError, GateProgress
from trm_store import Store
from trm_store.domain.gates import gate_blocks


async def test_progress_follows_the_recorded_blocks(store: Store) -> None:
    pool = units(95)
    seen: list[GateProgress] = []
    base = Arm("b", table(pool, WRONG, **{u: OK for u in pool[::3]}))
    cand = Arm("c", table(pool, OK, **{u: WRONG for u in pool[::4]}))
    result = await Gate(store, block_size=10).run(
        "g-p", pool, baseline=base, candidate=cand, seed=5, progress=seen.append
    )
    recorded = gate_blocks(store, "g-p")
    assert (
        [p.block for p in seen]
        == [b["block"] for b in recorded]
        == list(range(1, result.blocks + 1))
    )
    assert {(p.blocks, p.units_total, p.resumed_from) for p in seen} == {(10, 95, 0)}
    assert [p.units_done for p in seen] == [min(95, 10 * p.block) for p in seen]
    assert [p.decision for p in seen] == [b["decision"] for b in recorded]
    assert seen[-1].decision == result.verdict
    assert (seen[-1].wins, seen[-1].losses, seen[-1].e_value) == (
        result.wins,
        result.losses,
        result.e_value,
    )


async def test_a_bad_progress_is_refused_before_anything_is_written(store: Store) -> None:
    pool = units(10)
    arm = Arm("b", table(pool, OK))
    with pytest.raises(GateInputError, match="progress"):
        await Gate(store).run("g-bad", pool, baseline=arm, candidate=arm, progress=3)  # type: ignore[arg-type]
    assert store.read_stream("gate:g-bad") == []
