"""The gate's inputs are read once: what a check passed is what is kept and counted, even from
a collection that gives other items on a later pass (a lazy or mutating one)."""

from __future__ import annotations

from typing import Any

from tests.changing import ChangingSequence, ChangingSet
from trm_gate import GateConfig, QuestionResult, fold_unit, fold_units, pair_block


def _outcomes(correct: bool) -> dict[str, Any]:
    return {u: fold_unit([QuestionResult(f"{u}-q", u, correct, "stop")]) for u in ("u1", "u2")}


def test_infra_reasons_kept_are_the_ones_checked() -> None:
    config = GateConfig(infra_reasons=ChangingSet({"error"}, {"no_such_reason", 42}, good=2))
    assert config.infra_reasons == frozenset({"error"})
    assert config.to_record()["infra_reasons"] == ["error"]


def test_cache_hits_counted_are_the_ones_checked() -> None:
    cached = ChangingSequence(["u1"], ["u1", "x", "y"], good=2)
    pairing = pair_block(_outcomes(False), _outcomes(True), cached=cached)
    assert pairing.baseline_cache_hits == 1


def test_units_folded_are_the_ones_asked() -> None:
    results = [QuestionResult("q1", "u1", True, "stop")]
    assert set(fold_units(results, ChangingSequence(["u1"], ["u2"]))) == {"u1"}
