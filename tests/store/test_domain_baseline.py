"""The baseline cache (seed task 6, store side): keyed outcomes, and never an INFRA unit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from trm_store import EventValidationError, NewEvent, Store, open_store
from trm_store.domain.baseline import BaselineCache, BaselineOutcome
from trm_store.domain.errors import DomainInputError, InfraOutcomeError


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as opened:
        yield opened


def _question(qid: str, correct: bool | None, stop_reason: str = "stop") -> dict[str, Any]:
    return {"question_id": qid, "correct": correct, "stop_reason": stop_reason}


def _outcome(*questions: dict[str, Any]) -> dict[str, Any]:
    graded = [q["correct"] is True for q in questions]
    return {
        "score": sum(graded) / len(graded),
        "n_questions": len(questions),
        "results": list(questions),
    }


class GateShaped:
    """Stands in for trm_gate's UnitOutcome: an object with `to_record()` in the gate's shape."""

    def __init__(self, unit_id: str, record: dict[str, Any]) -> None:
        self.unit_id, self.record = unit_id, record

    def to_record(self) -> dict[str, Any]:
        return {
            **self.record,
            "unit_id": self.unit_id,
            "infra": any(
                q["stop_reason"] in ("error", "parse_error") for q in self.record["results"]
            ),
            "results": [{**q, "unit_id": self.unit_id} for q in self.record["results"]],
        }


def test_put_then_get_by_snapshot_and_unit(store: Store) -> None:
    cache = BaselineCache(store)
    outcome = _outcome(_question("q1", True), _question("q2", False, "length"))
    cache.put("snap-a", "u1", outcome)
    got = cache.get("snap-a", "u1")
    assert isinstance(got, BaselineOutcome)
    assert (got.unit_id, got.score, got.n_questions) == ("u1", 0.5, 2)
    assert [(q.question_id, q.correct, q.stop_reason) for q in got.results] == [
        ("q1", True, "stop"),
        ("q2", False, "length"),
    ]
    assert cache.get("snap-b", "u1") is None
    assert cache.get("snap-a", "u2") is None
    cache.put("snap-a", "u1", _outcome(_question("q1", True), _question("q2", True)))
    assert cache.get("snap-a", "u1").score == 1.0  # type: ignore[union-attr]
    assert [e.type for e in store.read_stream("baseline:snap-a")] == ["baseline.unit_cached"] * 2


@pytest.mark.parametrize("infra_reason", ["error", "parse_error"])
def test_an_infra_unit_is_refused_outright_and_nothing_is_written(
    store: Store, infra_reason: str
) -> None:
    """Seed task 6: a baseline unit with an INFRA question is never cached."""
    cache = BaselineCache(store)
    head = store.head_position()
    outcome = GateShaped("u1", _outcome(_question("q1", True), _question("q2", None, infra_reason)))
    with pytest.raises(InfraOutcomeError) as caught:
        cache.put("snap", "u1", outcome)
    assert caught.value.question_ids == ["q2"]
    with pytest.raises(InfraOutcomeError):
        cache.put("snap", "u1", outcome.to_record())
    assert store.head_position() == head
    assert cache.get("snap", "u1") is None


def test_not_even_a_raw_append_can_cache_an_infra_unit(store: Store) -> None:
    data = {"unit_id": "u1", **_outcome(_question("q1", False, "error"))}
    with pytest.raises(EventValidationError, match="INFRA"):
        store.append("baseline:snap", [NewEvent("baseline.unit_cached", data)])
    assert store.head_position() == 0


def test_the_gates_unit_record_is_accepted_as_is(store: Store) -> None:
    cache = BaselineCache(store)
    record = _outcome(_question("q1", True), _question("q2", False), _question("q3", True))
    cache.put("snap", "u7", GateShaped("u7", record))
    cache.put("snap", "u8", BaselineOutcome(unit_id="u8", **_outcome(_question("q1", True))))
    assert cache.get("snap", "u7").n_questions == 3  # type: ignore[union-attr]
    assert cache.get("snap", "u8").score == 1.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("outcome", "why"),
    [
        ({**_outcome(_question("q1", True)), "score": 0.0}, "mean correctness"),
        ({**_outcome(_question("q1", True)), "n_questions": 2}, "n_questions"),
        (_outcome(_question("q1", True), _question("q1", False)), "twice"),
        (_outcome(_question("q1", None)), "correct"),
        ({**_outcome(_question("q1", True)), "unit_id": "other"}, "not 'u1'"),
        ({**_outcome(_question("q1", True)), "extra": 1}, "extra"),
        ({"score": 1.0, "n_questions": 1, "results": "q1"}, "list"),
        ({**_outcome(_question("q1", True)), "score": float("nan")}, "finite"),
        ({**_outcome(_question("q1", True)), "score": True}, "score"),
        ([1, 2], "mapping"),
    ],
)
def test_a_malformed_outcome_is_a_typed_error(store: Store, outcome: Any, why: str) -> None:
    with pytest.raises(DomainInputError, match=why):
        BaselineCache(store).put("snap", "u1", outcome)
    assert store.head_position() == 0


def test_invalidate_drops_one_snapshot_only(store: Store) -> None:
    cache = BaselineCache(store)
    for unit in ("u1", "u2"):
        cache.put("old", unit, _outcome(_question("q1", True)))
    cache.put("new", "u1", _outcome(_question("q1", False)))
    assert cache.invalidate("old", reason="grader v2") == 2
    assert (cache.get("old", "u1"), cache.get("old", "u2")) == (None, None)
    assert cache.get("new", "u1") is not None
    cache.put("old", "u1", _outcome(_question("q1", True)))  # the snapshot can be refilled
    assert cache.get("old", "u1") is not None
    assert [e.type for e in store.read_stream("baseline:old")][-2:] == [
        "baseline.invalidated",
        "baseline.unit_cached",
    ]
    assert store.verify_projections() == []
