"""Question results and their fold into unit outcomes.

The stop_reason set is closed on purpose: an unknown reason is an error, because silently
treating, say, a new provider failure code as a normal answer would score infrastructure as a
model failure and could freeze it into the baseline cache.

The stop reasons, what each means and which are INFRA: the table in `trm_store.vocabulary`, their
one definition.

What a consistent (correct, stop_reason) pair is: `trm_store.vocabulary.outcome_problem`, the
rule the run log and the baseline cache check too. A `QuestionResult` is checked against what
holds under every policy (a model outcome has a verdict; an `error` or `parse_error` is never
`correct=True`), the fold against the rest under its `infra_reasons`.

Which stop reasons count as INFRA is a parameter of the fold (`infra_reasons`, a subset of
`STOP_REASONS`, default `INFRA_STOP_REASONS`): an `error`/`parse_error` counted as INFRA has no
verdict (None); a harness that scores unparseable replies as wrong answers folds with
`{"error"}` and gives its `parse_error` results `correct=False` (the arm helper does, given the
same `infra_reasons`). A model outcome a gate counts as INFRA (say `length`) keeps its verdict,
which the fold ignores. `QuestionResult.infra` uses the default set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from trm_gate._checks import check_id
from trm_gate.errors import ArmResultError, GateInputError, UnknownStopReasonError
from trm_store.vocabulary import (  # one definition
    INFRA_STOP_REASONS,
    STOP_REASONS,
    outcome_problem,
)

__all__ = [
    "INFRA_STOP_REASONS",
    "STOP_REASONS",
    "QuestionResult",
    "UnitOutcome",
    "check_infra_reasons",
    "fold_unit",
    "fold_units",
]


@dataclass(frozen=True, slots=True)
class QuestionResult:
    """One graded (or failed) question of one unit, for one arm."""

    question_id: str
    unit_id: str
    correct: bool | None
    stop_reason: str

    def __post_init__(self) -> None:
        check_id("question_id", self.question_id)
        check_id("unit_id", self.unit_id)
        if self.stop_reason not in STOP_REASONS:
            raise UnknownStopReasonError(self.stop_reason, STOP_REASONS)
        # The one rule (trm_store.vocabulary), as far as it holds under every gate's policy;
        # the fold checks the rest under its own `infra_reasons`.
        problem = outcome_problem(self.correct, self.stop_reason, infra_reasons=None)
        if problem is not None:
            raise GateInputError(f"question {self.question_id!r}: {problem}")

    @property
    def infra(self) -> bool:
        """True when the question failed for infrastructure reasons, not the model's."""
        return self.stop_reason in INFRA_STOP_REASONS

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready dict (for the baseline cache and events)."""
        return {
            "question_id": self.question_id,
            "unit_id": self.unit_id,
            "correct": self.correct,
            "stop_reason": self.stop_reason,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> QuestionResult:
        """Inverse of `to_record`; validates like the constructor."""
        try:
            return cls(
                question_id=record["question_id"],
                unit_id=record["unit_id"],
                correct=record["correct"],
                stop_reason=record["stop_reason"],
            )
        except KeyError as e:
            raise GateInputError(f"question record lacks {e.args[0]!r}") from e


@dataclass(frozen=True, slots=True)
class UnitOutcome:
    """A unit's questions folded for one arm: score = mean correctness, or INFRA.

    Build it with `fold_unit`. It carries every question result, so it can be cached and
    re-folded; `score` is None for an INFRA unit (it takes no part in pairing).
    """

    unit_id: str
    results: tuple[QuestionResult, ...]
    infra_reasons: frozenset[str] = INFRA_STOP_REASONS
    infra: bool = field(init=False)
    score: float | None = field(init=False)

    def __post_init__(self) -> None:
        check_id("unit_id", self.unit_id)
        object.__setattr__(self, "infra_reasons", check_infra_reasons(self.infra_reasons))
        if not self.results:
            raise GateInputError(f"unit {self.unit_id!r} has no question results")
        seen: set[str] = set()
        for r in self.results:
            if not isinstance(r, QuestionResult):
                raise GateInputError(f"expected QuestionResult, got {type(r).__name__}")
            problem = outcome_problem(r.correct, r.stop_reason, self.infra_reasons)
            if problem is not None:
                where = f"unit {self.unit_id!r}, question {r.question_id!r}"
                raise GateInputError(f"{where}: {problem}")
            if r.unit_id != self.unit_id:
                raise GateInputError(
                    f"question {r.question_id!r} belongs to unit {r.unit_id!r}, "
                    f"not {self.unit_id!r}"
                )
            if r.question_id in seen:
                raise GateInputError(f"question {r.question_id!r} appears twice in a unit")
            seen.add(r.question_id)
        infra = any(r.stop_reason in self.infra_reasons for r in self.results)
        object.__setattr__(self, "infra", infra)
        score = None if infra else sum(1 for r in self.results if r.correct) / len(seen)
        object.__setattr__(self, "score", score)

    @property
    def n_questions(self) -> int:
        """How many questions the unit holds."""
        return len(self.results)

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready dict; `from_record` re-folds the questions, so it cannot drift."""
        return {
            "unit_id": self.unit_id,
            "score": self.score,
            "infra": self.infra,
            "n_questions": self.n_questions,
            "infra_reasons": sorted(self.infra_reasons),
            "results": [r.to_record() for r in self.results],
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> UnitOutcome:
        """Rebuild from `to_record` output (score and infra are recomputed, not trusted)."""
        try:
            raw = record["results"]
        except KeyError as e:
            raise GateInputError("unit record lacks 'results'") from e
        if not isinstance(raw, Sequence) or isinstance(raw, str):
            raise GateInputError("unit record 'results' must be a list")
        reasons = record.get("infra_reasons", INFRA_STOP_REASONS)
        if isinstance(reasons, list | tuple):
            reasons = frozenset(reasons)
        return fold_unit(
            (QuestionResult.from_record(r) for r in raw), infra_reasons=check_infra_reasons(reasons)
        )


def check_infra_reasons(reasons: object) -> frozenset[str]:
    """The stop reasons a gate counts as INFRA: a set drawn from `STOP_REASONS`, as a frozenset."""
    if not isinstance(reasons, AbstractSet):
        raise GateInputError(f"infra_reasons must be a set of stop reasons, got {reasons!r}")
    kept = frozenset(reasons)  # read once: the reasons checked are the reasons kept
    if not all(isinstance(r, str) for r in kept):
        raise GateInputError(f"infra_reasons must be a set of stop reasons, got {reasons!r}")
    unknown = kept - STOP_REASONS
    if unknown:
        raise UnknownStopReasonError(sorted(unknown)[0], STOP_REASONS)
    return kept


def fold_unit(
    results: Iterable[QuestionResult], *, infra_reasons: frozenset[str] = INFRA_STOP_REASONS
) -> UnitOutcome:
    """Fold one unit's question results; any INFRA question makes the whole unit INFRA."""
    results = tuple(results)
    if not results:
        raise GateInputError("cannot fold a unit with no question results")
    return UnitOutcome(unit_id=results[0].unit_id, results=results, infra_reasons=infra_reasons)


def fold_units(
    results: Iterable[QuestionResult],
    unit_ids: Sequence[str],
    *,
    infra_reasons: frozenset[str] = INFRA_STOP_REASONS,
) -> dict[str, UnitOutcome]:
    """Group an arm's results by unit and fold each; every asked unit must be answered.

    Raises ArmResultError when a unit is missing or a result names a unit not asked for:
    a silently missing unit would shrink the sample without anyone noticing.
    """
    grouped: dict[str, list[QuestionResult]] = {u: [] for u in unit_ids}  # unit_ids read once
    asked = grouped.keys()
    for r in results:
        if not isinstance(r, QuestionResult):
            raise ArmResultError(f"evaluate returned {type(r).__name__}, not QuestionResult")
        if r.unit_id not in asked:
            raise ArmResultError(f"evaluate returned a result for unit {r.unit_id!r}, not asked")
        grouped[r.unit_id].append(r)
    missing = sorted(u for u, rs in grouped.items() if not rs)
    if missing:
        raise ArmResultError(f"evaluate returned no result for unit(s) {missing}")
    try:
        return {u: fold_unit(rs, infra_reasons=infra_reasons) for u, rs in grouped.items()}
    except GateInputError as e:
        raise ArmResultError(f"evaluate returned inconsistent results: {e}") from e
