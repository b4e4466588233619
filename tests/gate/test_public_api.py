"""trm_gate's public names are exactly these (issue 13 point 8), with the SPEC section 6
signatures, and every exception it raises sits in its one tree (issue 13 point 6)."""

from __future__ import annotations

import ast
import inspect
import math
from pathlib import Path

import trm_gate
from trm_gate.errors import GateError


def test_exported_names() -> None:
    assert set(trm_gate.__all__) == {
        "DEFAULT_ACCEPT_GRID",
        "DEFAULT_FUTILITY_GRID",
        "INFRA_POLICIES",
        "MODEL_STOPS",
        "Answer",
        "AnsweredQuestion",
        "AskedQuestion",
        "GateNotResumableError",
        "GateProgress",
        "GateSettings",
        "GateSettingsError",
        "Graded",
        "Grader",
        "QuestionAsker",
        "ShortAnswerGrader",
        "arm_from_callable",
        "grade_short_answer",
        "number_in",
        "retry_after_attribute",
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
        "InfraPolicy",
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
        "to_e_value",
    }
    assert all(hasattr(trm_gate, name) for name in trm_gate.__all__)


def test_to_e_value_is_the_one_conversion_and_saturates() -> None:
    assert trm_gate.to_e_value(0.0) == 1.0
    assert trm_gate.to_e_value(math.log(20.0)) == math.exp(math.log(20.0))
    assert trm_gate.to_e_value(1e6) == math.inf  # exp would raise OverflowError
    assert trm_gate.to_e_value(-1e6) == 0.0


def test_every_exception_trm_gate_raises_is_in_its_tree() -> None:
    raised: set[str] = set()
    for path in Path(trm_gate.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                raised.add(func.id if isinstance(func, ast.Name) else ast.unparse(func))
    raised.discard("AttributeError")  # the module __getattr__ protocol (PEP 562)
    assert raised == {
        "GateInputError",
        "UnknownStopReasonError",
        "ArmResultError",
        "GateStateError",
        "GateSettingsError",
        "GateNotResumableError",
    }
    for name in raised:
        assert issubclass(getattr(trm_gate, name), GateError)


def test_spec_names_are_exported() -> None:
    spec = {
        "QuestionResult",
        "fold_unit",
        "UnitOutcome",
        "Arm",
        "Gate",
        "GateResult",
        "e_accept",
        "e_futility",
    }
    assert spec <= set(trm_gate.__all__)
    assert sorted(trm_gate.__all__) == sorted(set(trm_gate.__all__))


def test_spec_signatures() -> None:
    gate = inspect.signature(trm_gate.Gate)
    assert list(gate.parameters) == [
        "store",
        "alpha",
        "beta",
        "p1",
        "block_size",
        "max_pairs",
        "infra_max_rate",
        "infra_min_units",
        "infra_policy",
        "infra_reasons",
        "infra_margin",
        "infra_alpha",
    ]
    defaults = {k: p.default for k, p in gate.parameters.items() if k != "store"}
    assert defaults == {
        "alpha": 0.05,
        "beta": 0.2,
        "p1": 0.6,
        "block_size": 20,
        "max_pairs": None,
        "infra_max_rate": 0.2,
        "infra_min_units": 10,
        "infra_policy": "bounded",
        "infra_reasons": frozenset({"error", "parse_error"}),
        "infra_margin": 0.0,
        "infra_alpha": 0.05,
    }
    run = inspect.signature(trm_gate.Gate.run)
    assert list(run.parameters)[:5] == ["self", "gate_id", "unit_ids", "baseline", "candidate"]
    assert run.parameters["baseline"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(trm_gate.e_accept).parameters) == ["deltas", "grid"]
    assert list(inspect.signature(trm_gate.e_futility).parameters) == [
        "wins",
        "losses",
        "p1",
        "grid",
    ]
    assert list(inspect.signature(trm_gate.QuestionResult).parameters) == [
        "question_id",
        "unit_id",
        "correct",
        "stop_reason",
    ]
    result_fields = set(inspect.signature(trm_gate.GateResult).parameters)
    assert {
        "verdict",
        "wins",
        "losses",
        "ties",
        "infra_units_baseline",
        "infra_units_candidate",
        "e_value",
        "futility_e_value",
        "units_evaluated",
        "baseline_cache_hits",
    } <= result_fields
