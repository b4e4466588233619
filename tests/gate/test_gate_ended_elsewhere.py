"""A gate ended by another writer while it runs (`trm gates --mark-stale` on a slow block) stays
ended: the gate appends at the version it last wrote, so its late verdict is refused, not written
over the `gate.failed` the marker recorded."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from tests.gate.arms import OK, WRONG, table, units
from trm_gate import Arm, Gate, GateStateError, QuestionResult
from trm_store import Store, mark_stale_gates
from trm_store.domain.gates import gate_info, gate_stream


async def test_a_gate_marked_stale_mid_block_does_not_decide_over_it(store: Store) -> None:
    pool = units(40)
    baseline = table(pool, WRONG)
    candidate = table(pool, OK)

    async def candidate_marked_stale_meanwhile(unit_ids: Sequence[str]) -> list[QuestionResult]:
        # Another process judges the gate stale (its block took too long) before it answers.
        later = datetime.now(UTC) + timedelta(hours=2)
        assert mark_stale_gates(store, timedelta(hours=1), now=later) == ["g-stale"]
        return await candidate(unit_ids)

    gate = Gate(store, block_size=20)
    with pytest.raises(GateStateError, match="ended by another writer"):
        await gate.run(
            "g-stale",
            pool,
            baseline=Arm("base", baseline),
            candidate=Arm("cand", candidate_marked_stale_meanwhile),
        )
    info = gate_info(store, "g-stale")
    assert info["status"] == "failed"
    assert info["verdict"] is None
    kinds = [e.type for e in store.read_stream(gate_stream("g-stale"))]
    assert kinds == ["gate.started", "gate.failed"]  # no block, no decision, no second failure
