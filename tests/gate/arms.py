"""Table-driven arms for the gate tests: real async evaluate functions, no mocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from trm_gate import QuestionResult

Answer = tuple[bool | None, str]
OK: Answer = (True, "stop")
WRONG: Answer = (False, "stop")
ERROR: Answer = (None, "error")


@dataclass
class TableArm:
    """An arm whose answers come from a table (unit -> its questions' answers); it records every
    unit it is asked to evaluate, and can be told to fail on a given call."""

    answers: dict[str, list[Answer]]
    calls: list[list[str]] = field(default_factory=list)
    fail_on_call: int | None = None

    async def __call__(self, unit_ids: Sequence[str]) -> list[QuestionResult]:
        self.calls.append(list(unit_ids))
        if self.fail_on_call == len(self.calls):
            raise RuntimeError("provider down")
        return self.results(unit_ids)

    def results(self, unit_ids: Sequence[str]) -> list[QuestionResult]:
        return [
            QuestionResult(f"{u}-q{i}", u, correct, stop)
            for u in unit_ids
            for i, (correct, stop) in enumerate(self.answers[u])
        ]

    @property
    def evaluated(self) -> list[str]:
        return [u for call in self.calls for u in call]


def units(n: int) -> list[str]:
    return [f"u{i:03d}" for i in range(n)]


def table(pool: list[str], default: Answer, **special: Answer) -> TableArm:
    return TableArm({u: [special.get(u, default)] for u in pool})
