"""One definition of a consistent (correct, stop_reason) pair (issue 14 point 10), checked by the
run log, the baseline cache and the gate alike, with the gate's `infra_reasons` in mind: under
the default policy the gate accepts exactly the pairs the run log accepts; an `error` or
`parse_error` is never correct; one a gate does not count as INFRA is scored as wrong, and the
arm helper, given the gate's `infra_reasons`, produces exactly that."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from trm_gate import (
    INFRA_STOP_REASONS,
    STOP_REASONS,
    Gate,
    GateInputError,
    QuestionResult,
    ShortAnswerGrader,
    UnitOutcome,
    arm_from_callable,
    fold_unit,
)
from trm_store import DomainInputError, RunLog, Store, open_store
from trm_store.vocabulary import outcome_problem

PAIRS = list(itertools.product([True, False, None], sorted(STOP_REASONS)))
SCORE_UNREADABLE = frozenset({"error"})  # a harness that scores unreadable replies as wrong


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as s:
        yield s


def gate_accepts(correct: bool | None, stop: str, reasons: frozenset[str]) -> bool:
    try:
        fold_unit([QuestionResult("q", "u", correct, stop)], infra_reasons=reasons)
    except GateInputError:
        return False
    return True


def run_log_accepts(run: RunLog, correct: bool | None, stop: str) -> bool:
    try:
        run.record_prediction("q", unit_id="u", prediction=None, correct=correct, stop_reason=stop)
    except DomainInputError:
        return False
    return True


def test_the_gate_and_the_run_log_accept_the_same_pairs(store: Store) -> None:
    with RunLog(store, "r") as run:
        logged = {(c, s) for c, s in PAIRS if run_log_accepts(run, c, s)}
    gated = {(c, s) for c, s in PAIRS if gate_accepts(c, s, INFRA_STOP_REASONS)}
    assert gated == logged == {(c, s) for c, s in PAIRS if outcome_problem(c, s) is None}
    assert (True, "error") not in gated and (False, "parse_error") not in gated


@pytest.mark.parametrize("stop", sorted(INFRA_STOP_REASONS))
def test_a_failed_call_or_an_unreadable_reply_is_never_correct(stop: str) -> None:
    with pytest.raises(GateInputError, match="cannot be correct"):
        QuestionResult("q", "u", True, stop)
    for reasons in (INFRA_STOP_REASONS, SCORE_UNREADABLE, frozenset()):
        assert not gate_accepts(True, stop, reasons)


def test_under_another_policy_the_rule_follows_the_policy() -> None:
    assert gate_accepts(False, "parse_error", SCORE_UNREADABLE)
    assert not gate_accepts(None, "parse_error", SCORE_UNREADABLE)
    assert not gate_accepts(False, "error", SCORE_UNREADABLE)
    # A model outcome a gate counts as INFRA keeps its verdict (ignored by the fold).
    wide = INFRA_STOP_REASONS | {"length"}
    assert gate_accepts(False, "length", wide) and gate_accepts(True, "length", wide)
    assert fold_unit([QuestionResult("q", "u", False, "length")], infra_reasons=wide).infra


def test_a_unit_record_keeps_the_policy_it_was_folded_under() -> None:
    unit = fold_unit(
        [QuestionResult("a", "u", True, "stop"), QuestionResult("b", "u", False, "parse_error")],
        infra_reasons=SCORE_UNREADABLE,
    )
    again = UnitOutcome.from_record(unit.to_record())
    assert again == unit and again.score == 0.5 and not again.infra


@dataclass(frozen=True)
class Q:
    question_id: str
    unit_id: str
    answer: str


QUESTIONS = {f"u{n:02d}": [Q(f"u{n:02d}-q", f"u{n:02d}", str(n))] for n in range(20)}


async def test_the_arm_helper_follows_the_gates_infra_reasons(store: Store) -> None:
    async def right(q: Q) -> str:
        return f"ANSWER: {q.answer}"

    async def mumbles(q: Q) -> str:  # unreadable for half the units
        return "I would rather not say" if int(q.answer) % 2 else f"ANSWER: {q.answer}"

    grader = ShortAnswerGrader()

    def arm(name: str, ask: object) -> object:
        return arm_from_callable(
            f"{name}|{grader.version}",
            ask,  # type: ignore[arg-type]
            grader,
            questions=QUESTIONS.__getitem__,
            infra_reasons=SCORE_UNREADABLE,
        )

    gate = Gate(store, block_size=10, infra_reasons=SCORE_UNREADABLE)
    result = await gate.run(
        "g", list(QUESTIONS), baseline=arm("b", right), candidate=arm("c", mumbles), seed=1
    )
    # The unreadable replies are wrong answers, not INFRA: losses, no INFRA unit, a verdict.
    assert result.infra_units_candidate == 0 and result.wins == 0 and result.losses > 0
    assert result.verdict == "reject"
