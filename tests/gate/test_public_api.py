"""trm_gate exports the SPEC section 6 names, with the SPEC signatures."""

from __future__ import annotations

import inspect

import trm_gate


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
