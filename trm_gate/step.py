"""The gate's pure core: (state, block of pairs) -> (state, decision). No I/O, no clock.

W/L/ties count the paired units only; E+ and E- also take the INFRA units at their worst case
under the "bounded" policy (`BlockPairing.accept_deltas` / `futility_deltas`).

Order of checks after folding a block in: the INFRA guard (`infra_abort`), then E+ >= 1/alpha
(`accept`), then E- >= 1/beta (`reject`), then the pair cap or the end of the pool
(`inconclusive`). Accept wins over reject if both cross in the same block: accept is the claim
whose error is controlled at alpha, and both crossing means a real but modest improvement.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from trm_gate.config import GateConfig
from trm_gate.eprocess import (
    DeltaCounts,
    count_deltas,
    log_e_accept,
    log_e_futility,
    merge_counts,
    to_e_value,
)
from trm_gate.errors import GateInputError, GateStateError
from trm_gate.guard import infra_violation
from trm_gate.pairing import BlockPairing

__all__ = ["Decision", "GateState", "Verdict", "run_blocks", "step"]

Verdict = Literal["accept", "reject", "inconclusive", "infra_abort"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do after a block: `continue`, or a final verdict with the reason."""

    verdict: Verdict | Literal["continue"]
    reason: str = ""

    @property
    def final(self) -> bool:
        """True once the gate has its verdict."""
        return self.verdict != "continue"


@dataclass(frozen=True, slots=True)
class GateState:
    """Cumulative evidence after some blocks; start with `GateState(config)`.

    wins/losses/ties: paired units only. accept_counts: the deltas E+ multiplies;
    futility_wins/futility_losses: the signs E- counts (both include the bounded INFRA units
    under the "bounded" policy and equal the paired ones under "exclude").
    """

    config: GateConfig
    blocks: int = 0
    units: int = 0
    wins: int = 0
    losses: int = 0
    ties: int = 0
    infra_baseline: int = 0
    infra_candidate: int = 0
    infra_both: int = 0
    baseline_evaluated: int = 0
    baseline_cache_hits: int = 0
    accept_counts: DeltaCounts = ()
    futility_wins: int = 0
    futility_losses: int = 0
    log_e_value: float = 0.0
    log_futility_e_value: float = 0.0
    verdict: Verdict | None = None
    reason: str = ""

    @property
    def e_value(self) -> float:
        """E+ so far (1.0 before any evidence)."""
        return to_e_value(self.log_e_value)

    @property
    def futility_e_value(self) -> float:
        """E- so far (1.0 before any evidence)."""
        return to_e_value(self.log_futility_e_value)

    @property
    def discordant(self) -> int:
        """W + L: the pairs that carry signal (what max_pairs caps)."""
        return self.wins + self.losses


def step(
    state: GateState, block: BlockPairing, *, final: bool = False
) -> tuple[GateState, Decision]:
    """Fold one block into the state and decide; `final` says the pool has no more units."""
    if state.verdict is not None:
        raise GateStateError(f"the gate already ended with {state.verdict!r}")
    cfg = state.config
    counts = merge_counts(state.accept_counts, count_deltas(block.accept_deltas(cfg.infra_policy)))
    futility = block.futility_deltas(cfg.infra_policy)
    f_wins = state.futility_wins + sum(1 for d in futility if d > 0)
    f_losses = state.futility_losses + sum(1 for d in futility if d < 0)
    new = replace(
        state,
        blocks=state.blocks + 1,
        units=state.units + block.units,
        wins=state.wins + block.wins,
        losses=state.losses + block.losses,
        ties=state.ties + block.ties,
        infra_baseline=state.infra_baseline + block.infra_baseline,
        infra_candidate=state.infra_candidate + block.infra_candidate,
        infra_both=state.infra_both + block.infra_both,
        baseline_evaluated=state.baseline_evaluated + block.baseline_evaluated,
        baseline_cache_hits=state.baseline_cache_hits + block.baseline_cache_hits,
        accept_counts=counts,
        futility_wins=f_wins,
        futility_losses=f_losses,
        log_e_value=log_e_accept(counts, cfg.accept_grid),
        log_futility_e_value=log_e_futility(f_wins, f_losses, cfg.p1, cfg.futility_grid),
    )
    decision = _decide(new, final=final)
    if decision.verdict != "continue":
        new = replace(new, verdict=decision.verdict, reason=decision.reason)
    return new, decision


def _decide(s: GateState, *, final: bool) -> Decision:
    cfg = s.config
    max_rate, margin, infra_alpha = cfg.guard_rates
    tripped = infra_violation(
        units=s.units,
        infra_baseline=s.infra_baseline,
        infra_candidate=s.infra_candidate,
        infra_both=s.infra_both,
        max_rate=max_rate,
        margin=margin,
        alpha=infra_alpha,
        min_units=cfg.infra_min_units,
    )
    if tripped is not None:
        return Decision("infra_abort", tripped)
    if s.log_e_value >= cfg.log_accept_threshold:
        return Decision("accept", f"E+ = {s.e_value:.4g} >= 1/alpha = {1 / cfg.alpha:g}")
    if s.log_futility_e_value >= cfg.log_futility_threshold:
        return Decision("reject", f"E- = {s.futility_e_value:.4g} >= 1/beta = {1 / cfg.beta:g}")
    if cfg.max_pairs is not None and s.discordant >= cfg.max_pairs:
        return Decision("inconclusive", f"pair cap reached: W + L = {s.discordant}")
    if final:
        return Decision("inconclusive", "unit pool exhausted")
    return Decision("continue")


def run_blocks(config: GateConfig, blocks: Iterable[BlockPairing]) -> GateState:
    """Fold `step` over blocks already paired (replays, simulations) until the verdict.

    Consumes `blocks` lazily, one block ahead, and stops at the first final decision; running
    out of blocks is the end of the pool (`inconclusive`).
    """
    it = iter(blocks)
    block = next(it, None)
    if block is None:
        raise GateInputError("no blocks: the unit pool is empty")
    state = GateState(config)
    while block is not None:
        upcoming = next(it, None)
        state, decision = step(state, block, final=upcoming is None)
        if decision.final:
            break
        block = upcoming
    return state
