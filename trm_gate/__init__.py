"""trm_gate: the anytime-valid block-sequential gate (paired flips, e-processes, INFRA guard).

The pure core (results, pairing, e-processes, step, guard) loads eagerly and imports nothing
from trm_store but `trm_store.vocabulary`; `Gate`, `Arm`, `Evaluate` and `GateResult` need the
store and load on first use (PEP 562), so `import trm_gate` loads no database library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trm_gate.config import GateConfig
from trm_gate.eprocess import (
    DEFAULT_ACCEPT_GRID,
    DEFAULT_FUTILITY_GRID,
    e_accept,
    e_futility,
    to_e_value,
)
from trm_gate.errors import (
    ArmResultError,
    GateError,
    GateInputError,
    GateNotResumableError,
    GateSettingsError,
    GateStateError,
    UnknownStopReasonError,
)
from trm_gate.grading import (
    AnsweredQuestion,
    Graded,
    Grader,
    ShortAnswerGrader,
    grade_short_answer,
    number_in,
)
from trm_gate.pairing import INFRA_POLICIES, BlockPairing, InfraPolicy, pair_block
from trm_gate.results import (
    INFRA_STOP_REASONS,
    STOP_REASONS,
    QuestionResult,
    UnitOutcome,
    fold_unit,
    fold_units,
)
from trm_gate.step import Decision, GateState, Verdict, run_blocks, step

if TYPE_CHECKING:
    from trm_gate.asking import (
        MODEL_STOPS,
        Answer,
        AskedQuestion,
        QuestionAsker,
        arm_from_callable,
        retry_after_attribute,
    )
    from trm_gate.gate import Arm, Evaluate, Gate, GateProgress, GateResult
    from trm_gate.settings import GateSettings

# Names that need the store (trm_gate.gate and what builds on it) or pydantic-settings: loaded
# on first use.
_LAZY = {
    **dict.fromkeys(("Arm", "Evaluate", "Gate", "GateProgress", "GateResult"), "trm_gate.gate"),
    **dict.fromkeys(
        (
            "MODEL_STOPS",
            "Answer",
            "AskedQuestion",
            "QuestionAsker",
            "arm_from_callable",
            "retry_after_attribute",
        ),
        "trm_gate.asking",
    ),
    "GateSettings": "trm_gate.settings",
}

__all__ = [
    "DEFAULT_ACCEPT_GRID",
    "DEFAULT_FUTILITY_GRID",
    "INFRA_POLICIES",
    "INFRA_STOP_REASONS",
    "MODEL_STOPS",
    "STOP_REASONS",
    "Answer",
    "AnsweredQuestion",
    "Arm",
    "ArmResultError",
    "AskedQuestion",
    "BlockPairing",
    "Decision",
    "Evaluate",
    "Gate",
    "GateConfig",
    "GateError",
    "GateInputError",
    "GateNotResumableError",
    "GateProgress",
    "GateResult",
    "GateSettings",
    "GateSettingsError",
    "GateState",
    "GateStateError",
    "Graded",
    "Grader",
    "InfraPolicy",
    "QuestionAsker",
    "QuestionResult",
    "ShortAnswerGrader",
    "UnitOutcome",
    "UnknownStopReasonError",
    "Verdict",
    "arm_from_callable",
    "e_accept",
    "e_futility",
    "fold_unit",
    "fold_units",
    "grade_short_answer",
    "number_in",
    "pair_block",
    "retry_after_attribute",
    "run_blocks",
    "step",
    "to_e_value",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trm_gate' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
