"""Pairing a block's units across the two arms into paired flips, and the INFRA policies' bounds.

D = candidate score - baseline score in [-1, 1]; a win is D > 0, a loss D < 0, a tie D = 0 (no
signal). A unit that is INFRA in either arm is excluded from D and from W/L, always: its outcome
says nothing about the model, only about the infrastructure (the INFRA guard watches those).

What the e-processes do with an INFRA unit is the gate's `infra_policy`:
- "bounded" (the default): the unknown score of an INFRA arm is replaced by its worst case for
  the claim each e-process makes. For accept (the candidate is better) a candidate INFRA score
  counts 0 and a baseline INFRA score 1, so the unit enters E+ with D = (c or 0) - (b or 1) <= 0;
  for futility (the candidate wins less than p1) the opposite, D = (c or 1) - (b or 0) >= 0.
  Each bounded D is at most (accept) or at least (futility) the D the unit would have had, so
  both e-processes stay valid whatever causes INFRA (see `trm_gate.eprocess`).
- "exclude": the unit is left out of both e-processes, as it is left out of W/L. Valid only when
  INFRA is independent of the outcomes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from trm_gate._checks import check_count, check_real
from trm_gate.eprocess import count_deltas
from trm_gate.errors import GateInputError
from trm_gate.results import UnitOutcome

__all__ = ["INFRA_POLICIES", "BlockPairing", "InfraPolicy", "InfraScores", "pair_block"]

InfraPolicy = Literal["bounded", "exclude"]
INFRA_POLICIES: tuple[InfraPolicy, ...] = ("bounded", "exclude")

InfraScores = tuple[float | None, float | None]
"""An INFRA unit's (baseline score, candidate score); None for the arm(s) that were INFRA."""


@dataclass(frozen=True, slots=True)
class BlockPairing:
    """What the gate's step needs from one block: the deltas, the INFRA units and counts.

    `units` counts every unit of the block; `deltas` holds one D per unit that is non-INFRA in
    both arms; `infra_scores` one entry per other unit, with the score its non-INFRA arm got
    (None where that arm was INFRA too). Left empty, every INFRA unit is bounded as if both
    arms were INFRA (D = -1 for accept, +1 for futility): still valid, only more conservative.
    `baseline_cache_hits` counts units whose baseline came from the cache (never INFRA).
    """

    units: int
    deltas: tuple[float, ...]
    infra_baseline: int
    infra_candidate: int
    baseline_cache_hits: int = 0
    infra_scores: tuple[InfraScores, ...] = ()

    def __post_init__(self) -> None:
        check_count("units", self.units)
        count_deltas(self.deltas)
        ib = check_count("infra_baseline", self.infra_baseline)
        ic = check_count("infra_candidate", self.infra_candidate)
        hits = check_count("baseline_cache_hits", self.baseline_cache_hits)
        excluded = self.units - len(self.deltas)
        if not max(ib, ic) <= excluded <= ib + ic:
            raise GateInputError(
                f"inconsistent block: {self.units} units, {len(self.deltas)} paired, "
                f"INFRA baseline {ib}, candidate {ic}"
            )
        if hits > self.units - ib:
            raise GateInputError("a cached baseline unit cannot be INFRA")
        if self.infra_scores:
            _check_infra_scores(self.infra_scores, excluded, ib, ic)

    @property
    def wins(self) -> int:
        """Units where the candidate scored higher."""
        return sum(1 for d in self.deltas if d > 0)

    @property
    def losses(self) -> int:
        """Units where the baseline scored higher."""
        return sum(1 for d in self.deltas if d < 0)

    @property
    def ties(self) -> int:
        """Paired units with equal scores."""
        return sum(1 for d in self.deltas if d == 0)

    @property
    def infra_both(self) -> int:
        """Units that were INFRA in both arms."""
        return self.infra_baseline + self.infra_candidate - (self.units - len(self.deltas))

    @property
    def baseline_evaluated(self) -> int:
        """Units whose baseline was evaluated in this block (cache misses)."""
        return self.units - self.baseline_cache_hits

    def accept_deltas(self, policy: InfraPolicy) -> tuple[float, ...]:
        """The deltas E+ multiplies: the paired ones, plus each INFRA unit at its worst case for
        accept under "bounded" (candidate INFRA counts 0, baseline INFRA counts 1)."""
        return self.deltas + tuple(_bound(s, 0.0, 1.0) for s in self._bounded(policy))

    def futility_deltas(self, policy: InfraPolicy) -> tuple[float, ...]:
        """The deltas E- counts as wins/losses: the paired ones, plus each INFRA unit at its
        worst case for futility under "bounded" (candidate INFRA counts 1, baseline INFRA 0)."""
        return self.deltas + tuple(_bound(s, 1.0, 0.0) for s in self._bounded(policy))

    def _bounded(self, policy: InfraPolicy) -> tuple[InfraScores, ...]:
        if policy == "exclude":
            return ()
        if self.infra_scores:
            return self.infra_scores
        return ((None, None),) * (self.units - len(self.deltas))


def _bound(scores: InfraScores, candidate_if_infra: float, baseline_if_infra: float) -> float:
    baseline, candidate = scores
    c = candidate_if_infra if candidate is None else candidate
    b = baseline_if_infra if baseline is None else baseline
    return c - b


def _check_infra_scores(
    scores: tuple[InfraScores, ...], excluded: int, infra_baseline: int, infra_candidate: int
) -> None:
    if len(scores) != excluded:
        raise GateInputError(f"infra_scores has {len(scores)} entries for {excluded} INFRA units")
    for entry in scores:
        if not isinstance(entry, tuple) or len(entry) != 2:
            raise GateInputError(f"an infra_scores entry must be a pair, got {entry!r}")
        for score in entry:
            if score is not None and not 0.0 <= check_real("score", score) <= 1.0:
                raise GateInputError(f"a score must be in [0, 1], got {score!r}")
        if None not in entry:
            raise GateInputError(f"an infra_scores entry needs an INFRA arm, got {entry!r}")
    if (
        sum(1 for b, _ in scores if b is None) != infra_baseline
        or sum(1 for _, c in scores if c is None) != infra_candidate
    ):
        raise GateInputError("infra_scores disagree with the INFRA counts")


def pair_block(
    baseline: Mapping[str, UnitOutcome],
    candidate: Mapping[str, UnitOutcome],
    *,
    cached: Collection[str] = (),
) -> BlockPairing:
    """Pair two arms' outcomes over the same units; `cached` names baseline cache hits.
    Each argument is read once: what is checked is what is counted."""
    baseline, candidate, hits = dict(baseline), dict(candidate), set(cached)
    if set(baseline) != set(candidate):
        raise GateInputError(
            f"arms cover different units: baseline only {sorted(set(baseline) - set(candidate))},"
            f" candidate only {sorted(set(candidate) - set(baseline))}"
        )
    unknown = hits - set(baseline)
    if unknown:
        raise GateInputError(f"cached names units outside the block: {sorted(unknown)}")
    if any(baseline[u].infra for u in hits):
        raise GateInputError("a cached baseline unit cannot be INFRA")
    deltas: list[float] = []
    infra: list[InfraScores] = []
    for unit_id in sorted(baseline):
        b, c = baseline[unit_id], candidate[unit_id]
        if b.unit_id != unit_id or c.unit_id != unit_id:
            raise GateInputError(f"outcome filed under {unit_id!r} is for another unit")
        if b.score is not None and c.score is not None:
            deltas.append(c.score - b.score)
        else:
            infra.append((b.score, c.score))
    return BlockPairing(
        units=len(baseline),
        deltas=tuple(deltas),
        infra_baseline=sum(1 for b in baseline.values() if b.infra),
        infra_candidate=sum(1 for c in candidate.values() if c.infra),
        baseline_cache_hits=len(hits),
        infra_scores=tuple(infra),
    )
