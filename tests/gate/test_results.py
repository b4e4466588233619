"""Question results, the closed stop_reason set, and folding units (score, INFRA, records)."""

from __future__ import annotations

import pytest

from trm_gate import (
    INFRA_STOP_REASONS,
    STOP_REASONS,
    ArmResultError,
    GateInputError,
    QuestionResult,
    UnitOutcome,
    UnknownStopReasonError,
    fold_unit,
    fold_units,
)


def q(
    qid: str, unit: str = "u1", correct: bool | None = True, stop: str = "stop"
) -> QuestionResult:
    return QuestionResult(question_id=qid, unit_id=unit, correct=correct, stop_reason=stop)


def test_infra_set_is_exactly_error_and_parse_error() -> None:
    assert frozenset({"error", "parse_error"}) == INFRA_STOP_REASONS
    assert INFRA_STOP_REASONS < STOP_REASONS
    flagged = {r for r in STOP_REASONS if QuestionResult("q", "u", False, r).infra}
    assert flagged == {"error", "parse_error"}


@pytest.mark.parametrize("stop", ["timeout", "", "ERROR", "Stop", None, 3])
def test_unknown_stop_reason_is_a_typed_error(stop: object) -> None:
    with pytest.raises(UnknownStopReasonError) as info:
        QuestionResult("q1", "u1", True, stop)  # type: ignore[arg-type]
    assert isinstance(info.value, GateInputError)
    assert isinstance(info.value, ValueError)
    assert info.value.stop_reason == stop


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"question_id": ""}, "question_id"),
        ({"unit_id": ""}, "unit_id"),
        ({"unit_id": 7}, "unit_id"),
        ({"question_id": "q" * 256}, "question_id"),
        ({"correct": 1}, "correct"),
        ({"correct": None}, "needs a verdict"),
        ({"correct": None, "stop_reason": "length"}, "needs a verdict"),
        ({"stop_reason": "error"}, "cannot be correct"),
        ({"stop_reason": "parse_error"}, "cannot be correct"),
    ],
)
def test_bad_question_result_is_refused(kwargs: dict[str, object], match: str) -> None:
    base: dict[str, object] = {
        "question_id": "q1",
        "unit_id": "u1",
        "correct": True,
        "stop_reason": "stop",
    }
    with pytest.raises(GateInputError, match=match):
        QuestionResult(**{**base, **kwargs})  # type: ignore[arg-type]


def test_fold_scores_mean_correctness() -> None:
    out = fold_unit(
        [q("a", correct=True), q("b", correct=False), q("c", stop="length", correct=True)]
    )
    assert out.unit_id == "u1"
    assert out.score == pytest.approx(2 / 3)
    assert not out.infra
    assert out.n_questions == 3


@pytest.mark.parametrize("stop", sorted(INFRA_STOP_REASONS))
def test_any_infra_question_makes_the_unit_infra(stop: str) -> None:
    out = fold_unit([q("a"), q("b"), q("c", correct=None, stop=stop)])
    assert out.infra
    assert out.score is None
    assert out.n_questions == 3


def test_an_infra_question_has_no_verdict_under_the_default_policy() -> None:
    with pytest.raises(GateInputError, match="INFRA failure and has no verdict"):
        fold_unit([q("a", correct=False, stop="error")])
    out = fold_unit([q("a", correct=None, stop="error")])
    assert out.infra and out.score is None


@pytest.mark.parametrize(
    ("results", "match"),
    [
        ([], "no question results"),
        ([q("a", unit="u1"), q("b", unit="u2")], "belongs to unit"),
        ([q("a"), q("a")], "appears twice"),
    ],
)
def test_fold_refuses_bad_units(results: list[QuestionResult], match: str) -> None:
    with pytest.raises(GateInputError, match=match):
        fold_unit(results)


def test_record_round_trip_recomputes_score() -> None:
    out = fold_unit([q("a"), q("b", correct=False), q("c", correct=None, stop="parse_error")])
    rec = out.to_record()
    assert rec["infra"] is True and rec["score"] is None and rec["n_questions"] == 3
    assert UnitOutcome.from_record(rec) == out
    clean = fold_unit([q("a"), q("b", correct=False)])
    tampered = {**clean.to_record(), "score": 1.0}
    assert UnitOutcome.from_record(tampered).score == 0.5


@pytest.mark.parametrize(
    "record",
    [
        {},
        {"results": "nope"},
        {"results": [{"question_id": "a", "unit_id": "u1", "correct": True}]},
        {"results": [{"question_id": "a", "unit_id": "u1", "correct": True, "stop_reason": "x"}]},
    ],
)
def test_bad_record_is_refused(record: dict[str, object]) -> None:
    with pytest.raises(GateInputError):
        UnitOutcome.from_record(record)


def test_fold_units_groups_by_unit() -> None:
    outs = fold_units(
        [q("a", "u2"), q("b", "u1", correct=False), q("c", "u2", correct=False)], ["u1", "u2"]
    )
    assert outs["u1"].score == 0.0
    assert outs["u2"].score == 0.5


@pytest.mark.parametrize(
    ("results", "match"),
    [
        ([q("a", "u1")], "no result for unit"),
        ([q("a", "u1"), q("b", "u2"), q("c", "u3")], "not asked"),
        ([q("a", "u1"), q("a", "u1"), q("b", "u2")], "inconsistent"),
        (["not a result"], "not QuestionResult"),
    ],
)
def test_fold_units_refuses_answers_that_do_not_match_the_question(
    results: list[QuestionResult], match: str
) -> None:
    with pytest.raises(ArmResultError, match=match):
        fold_units(results, ["u1", "u2"])
