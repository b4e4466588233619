"""An interrupted gate says so: its `gate.failed` reason names the interruption and the block,
never an empty `CancelledError: ` (issue 17 point 4)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tests.gate.arms import OK, table, units
from trm_gate import Arm, Gate, QuestionResult
from trm_store import Store
from trm_store.domain.gates import gate_info, gate_stream


async def test_a_cancelled_gate_records_why_it_stopped(store: Store) -> None:
    pool = units(40)
    evaluating = asyncio.Event()

    async def hangs(unit_ids: Sequence[str]) -> list[QuestionResult]:
        evaluating.set()
        await asyncio.Event().wait()
        raise AssertionError("never answers")

    gate = Gate(store, block_size=20)
    task = asyncio.create_task(
        gate.run("g-cut", pool, baseline=Arm("base", table(pool, OK)), candidate=Arm("c", hangs))
    )
    await evaluating.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert gate_info(store, "g-cut")["status"] == "failed"
    (failed,) = [e for e in store.read_stream(gate_stream("g-cut")) if e.type == "gate.failed"]
    reason = failed.data["error"]
    assert reason == "CancelledError: interrupted in block 1 (the gate's task was stopped)"
