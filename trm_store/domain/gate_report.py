"""The report of one gate, read from its `gate:{id}` stream alone: parameters, blocks, verdict.

A derived view of the gate's events, not of the `gates` table, so it works on a store whose
projections are stale (and a read-only store never has to catch them up). E-values are given as
stored: logarithms, finite where an e-value may overflow a float; a reader that shows e-values
converts them (`trm_gate`'s `to_e_value`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

from trm_store.domain._common import as_utc, check_id
from trm_store.domain.errors import UnknownGateError
from trm_store.domain.gates import BLOCK_EVALUATED, DECIDED, STARTED, gate_stream

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["GateDecision", "GateReport", "GateReportBlock", "read_gate_report"]


class GateReportBlock(TypedDict):
    """One `gate.block_evaluated`, with the W/L totals up to it."""

    block: int
    units: int
    wins: int
    losses: int
    ties: int
    infra_baseline: int
    """INFRA units of the baseline arm in the block."""
    infra_candidate: int
    baseline_cache_hits: int
    total_wins: int
    total_losses: int
    log_e_value: float
    """log E+ after the block."""
    log_futility_e_value: float
    """log E- after the block."""
    decision: str
    """`continue`, or the verdict the block reached."""


class GateDecision(TypedDict):
    """The `gate.decided` event's data."""

    verdict: str
    reason: str
    blocks: int
    units_evaluated: int
    wins: int
    losses: int
    ties: int
    infra_units_baseline: int
    infra_units_candidate: int
    baseline_cache_hits: int
    log_e_value: float
    log_futility_e_value: float


class GateReport(TypedDict):
    """A gate as its events tell it."""

    gate_id: str
    baseline_snapshot: str
    candidate_snapshot: str
    seed: int
    pool_size: int
    config: dict[str, Any]
    """alpha, beta, p1, block_size, max_pairs, infra_max_rate, infra_min_units."""
    started_at: datetime
    blocks: list[GateReportBlock]
    status: Literal["running", "decided"]
    decision: GateDecision | None


def read_gate_report(store: Store, gate_id: str) -> GateReport:
    """The gate's report; UnknownGateError if no gate `gate_id` was started."""
    check_id("gate_id", gate_id)
    events = store.read_stream(gate_stream(gate_id))
    if not events or events[0].type != STARTED:
        raise UnknownGateError(f"no gate {gate_id!r} was started")
    started = events[0].data
    blocks: list[GateReportBlock] = []
    wins = losses = 0
    for event in events:
        if event.type != BLOCK_EVALUATED:
            continue
        d = event.data
        wins, losses = wins + d["wins"], losses + d["losses"]
        blocks.append(
            {
                "block": d["block"],
                "units": len(d["unit_ids"]),
                "wins": d["wins"],
                "losses": d["losses"],
                "ties": d["ties"],
                "infra_baseline": len(d["infra_baseline"]),
                "infra_candidate": len(d["infra_candidate"]),
                "baseline_cache_hits": d["baseline_cache_hits"],
                "total_wins": wins,
                "total_losses": losses,
                "log_e_value": d["log_e_value"],
                "log_futility_e_value": d["log_futility_e_value"],
                "decision": d["decision"],
            }
        )
    decided = next((e for e in events if e.type == DECIDED), None)
    return {
        "gate_id": gate_id,
        "baseline_snapshot": started["baseline_snapshot"],
        "candidate_snapshot": started["candidate_snapshot"],
        "seed": started["seed"],
        "pool_size": started["pool_size"],
        "config": dict(started["config"]),
        "started_at": as_utc(events[0].recorded_at),
        "blocks": blocks,
        "status": "running" if decided is None else "decided",
        # The event's model (GateDecided) has exactly GateDecision's fields.
        "decision": None if decided is None else cast(GateDecision, dict(decided.data)),
    }
