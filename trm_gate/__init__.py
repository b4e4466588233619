"""trm_gate: the anytime-valid block-sequential gate (paired flips, e-processes, INFRA guard)."""

from trm_gate.config import GateConfig
from trm_gate.eprocess import DEFAULT_ACCEPT_GRID, DEFAULT_FUTILITY_GRID, e_accept, e_futility
from trm_gate.errors import (
    ArmResultError,
    GateError,
    GateInputError,
    GateStateError,
    UnknownStopReasonError,
)
from trm_gate.gate import Arm, Evaluate, Gate, GateResult
from trm_gate.pairing import BlockPairing, pair_block
from trm_gate.results import (
    INFRA_STOP_REASONS,
    STOP_REASONS,
    QuestionResult,
    UnitOutcome,
    fold_unit,
    fold_units,
)
from trm_gate.step import Decision, GateState, Verdict, run_blocks, step

__all__ = [
    "DEFAULT_ACCEPT_GRID",
    "DEFAULT_FUTILITY_GRID",
    "INFRA_STOP_REASONS",
    "STOP_REASONS",
    "Arm",
    "ArmResultError",
    "BlockPairing",
    "Decision",
    "Evaluate",
    "Gate",
    "GateConfig",
    "GateError",
    "GateInputError",
    "GateResult",
    "GateState",
    "GateStateError",
    "QuestionResult",
    "UnitOutcome",
    "UnknownStopReasonError",
    "Verdict",
    "e_accept",
    "e_futility",
    "fold_unit",
    "fold_units",
    "pair_block",
    "run_blocks",
    "step",
]
