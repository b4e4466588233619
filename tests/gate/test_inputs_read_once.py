"""The gate's inputs are read once: what a check passed is what is kept and counted, even from
a collection that gives other items on a later pass (a lazy or mutating one)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Set
from typing import Any

from trm_gate import GateConfig, QuestionResult, fold_unit, fold_units, pair_block


class _Passes:
    """Gives `first` for the first `good` passes and `later` after."""

    def __init__(self, first: Any, later: Any, good: int = 1) -> None:
        self._first, self._later, self._passes, self._good = first, later, 0, good

    def _now(self) -> Any:
        return self._first if self._passes < self._good else self._later

    def __len__(self) -> int:
        return len(self._now())

    def __contains__(self, item: object) -> bool:
        return item in self._now()

    def __iter__(self) -> Iterator[Any]:
        items = self._now()
        self._passes += 1
        yield from items


class _FlipSet(_Passes, Set[Any]):
    pass


class _FlipSequence(_Passes, Sequence[Any]):
    def __getitem__(self, index: Any) -> Any:
        return self._now()[index]


def _outcomes(correct: bool) -> dict[str, Any]:
    return {u: fold_unit([QuestionResult(f"{u}-q", u, correct, "stop")]) for u in ("u1", "u2")}


def test_infra_reasons_kept_are_the_ones_checked() -> None:
    config = GateConfig(infra_reasons=_FlipSet({"error"}, {"no_such_reason", 42}, good=2))
    assert config.infra_reasons == frozenset({"error"})
    assert config.to_record()["infra_reasons"] == ["error"]


def test_cache_hits_counted_are_the_ones_checked() -> None:
    cached = _FlipSequence(["u1"], ["u1", "x", "y"], good=2)
    pairing = pair_block(_outcomes(False), _outcomes(True), cached=cached)
    assert pairing.baseline_cache_hits == 1


def test_units_folded_are_the_ones_asked() -> None:
    results = [QuestionResult("q1", "u1", True, "stop")]
    assert set(fold_units(results, _FlipSequence(["u1"], ["u2"]))) == {"u1"}
