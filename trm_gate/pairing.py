"""Pairing a block's units across the two arms into paired flips.

D = candidate score - baseline score in [-1, 1]; a win is D > 0, a loss D < 0, a tie D = 0 (no
signal). A unit that is INFRA in either arm is excluded from D and from W/L: its outcome says
nothing about the model, only about the infrastructure (the INFRA guard watches those counts).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from trm_gate._checks import check_count
from trm_gate.eprocess import count_deltas
from trm_gate.errors import GateInputError
from trm_gate.results import UnitOutcome

__all__ = ["BlockPairing", "pair_block"]


@dataclass(frozen=True, slots=True)
class BlockPairing:
    """What the gate's step needs from one block: the deltas and the INFRA counts.

    `units` counts every unit of the block; `deltas` holds one D per unit that is non-INFRA in
    both arms; `baseline_cache_hits` counts units whose baseline came from the cache (they were
    not evaluated now, so they do not count towards the baseline's INFRA rate).
    """

    units: int
    deltas: tuple[float, ...]
    infra_baseline: int
    infra_candidate: int
    baseline_cache_hits: int = 0

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
    def baseline_evaluated(self) -> int:
        """Units whose baseline was evaluated in this block (cache misses)."""
        return self.units - self.baseline_cache_hits


def pair_block(
    baseline: Mapping[str, UnitOutcome],
    candidate: Mapping[str, UnitOutcome],
    *,
    cached: Collection[str] = (),
) -> BlockPairing:
    """Pair two arms' outcomes over the same units; `cached` names baseline cache hits."""
    if set(baseline) != set(candidate):
        raise GateInputError(
            f"arms cover different units: baseline only {sorted(set(baseline) - set(candidate))},"
            f" candidate only {sorted(set(candidate) - set(baseline))}"
        )
    unknown = set(cached) - set(baseline)
    if unknown:
        raise GateInputError(f"cached names units outside the block: {sorted(unknown)}")
    if any(baseline[u].infra for u in cached):
        raise GateInputError("a cached baseline unit cannot be INFRA")
    deltas: list[float] = []
    for unit_id in sorted(baseline):
        b, c = baseline[unit_id], candidate[unit_id]
        if b.unit_id != unit_id or c.unit_id != unit_id:
            raise GateInputError(f"outcome filed under {unit_id!r} is for another unit")
        if b.score is not None and c.score is not None:
            deltas.append(c.score - b.score)
    return BlockPairing(
        units=len(baseline),
        deltas=tuple(deltas),
        infra_baseline=sum(1 for b in baseline.values() if b.infra),
        infra_candidate=sum(1 for c in candidate.values() if c.infra),
        baseline_cache_hits=len(set(cached)),
    )
