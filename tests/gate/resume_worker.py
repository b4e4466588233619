"""A gate over deterministic outcomes, run in a child process that the resume test SIGKILLs.

`python -m tests.gate.resume_worker DB_URL GATE_ID HANG_AT`: runs gate GATE_ID over `POOL` with
`arms()`; the arms' evaluate hangs at block HANG_AT (0: never), so the parent can kill the
process mid-run, with HANG_AT - 1 blocks on record.
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Sequence

from tests.gate.arms import units
from trm_gate import Arm, Gate, QuestionResult
from trm_store import Store, open_store

POOL = units(240)
SEED = 7
BLOCK = 12


def outcome(arm: str, unit: str, question: int) -> bool:
    """Right or wrong, fixed by (arm, unit, question): the candidate is right a bit more often."""
    p = 0.5 if arm == "baseline" else 0.62
    return random.Random(f"{arm}|{unit}|{question}").random() < p


def arms(hang_at: int = 0) -> tuple[Arm, Arm]:
    calls = {"baseline": 0, "candidate": 0}

    def evaluate(arm: str):  # type: ignore[no-untyped-def]
        async def run(unit_ids: Sequence[str]) -> list[QuestionResult]:
            calls[arm] += 1
            if hang_at and calls[arm] >= hang_at:
                await asyncio.sleep(3600)
            return [
                QuestionResult(f"{u}-q{i}", u, outcome(arm, u, i), "stop")
                for u in unit_ids
                for i in range(3)
            ]

        return run

    return Arm("base@1", evaluate("baseline")), Arm("cand@1", evaluate("candidate"))


def gate(store: Store) -> Gate:
    return Gate(store, block_size=BLOCK)


async def main(url: str, gate_id: str, hang_at: int) -> None:
    with open_store(url) as store:
        baseline, candidate = arms(hang_at)
        await gate(store).run(gate_id, POOL, baseline=baseline, candidate=candidate, seed=SEED)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
