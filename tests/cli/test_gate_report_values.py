"""`read_gate_report` gives what the log stores (log e-values); `trm gate-report` converts them for
display, and its JSON stays valid JSON when an e-value overflows a float (null, never Infinity)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store.test_gates_projection import block, decided
from trm_store import NewEvent, open_store
from trm_store.cli.common import json_e_value
from trm_store.cli.gate_report import gate_report
from trm_store.domain.gate_report import GateReportBlock, read_gate_report


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


CONFIG = {
    "alpha": 0.05,
    "beta": 0.2,
    "p1": 0.6,
    "block_size": 2,
    "max_pairs": None,
    "infra_max_rate": 0.2,
    "infra_min_units": 10,
}


def started() -> NewEvent:
    data = {"baseline_snapshot": "b@1", "candidate_snapshot": "c@1", "seed": 7, "pool_size": 4}
    return NewEvent("gate.started", {**data, "config": CONFIG})


LOGS = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(log_e=LOGS, log_futility=LOGS, n=st.integers(0, 10**9))
def test_json_report_is_valid_json_for_any_stored_log_e_value(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], log_e: float, log_futility: float, n: int
) -> None:
    gate_id = f"g{n}-{log_e}-{log_futility}"
    with open_store(sqlite_url) as store:
        if not store.read_stream(f"gate:{gate_id}"):
            events = [
                started(),
                block(1, ["u1"], log_e_value=log_e, log_futility_e_value=log_futility),
            ]
            store.append(f"gate:{gate_id}", [*events, decided(log_e_value=log_e)])
        capsys.readouterr()
        assert gate_report(store, gate_id, as_json=True) == 0
    (shown,) = _strict(capsys.readouterr().out)["blocks"]  # type: ignore[index]
    assert (shown["log_e_value"], shown["log_futility_e_value"]) == (log_e, log_futility)
    for key, log in (("e_value", log_e), ("futility_e_value", log_futility)):
        if log > 709.78:  # exp overflows a float
            assert shown[key] is None
        else:
            assert shown[key] == pytest.approx(math.exp(log), rel=1e-12, abs=0.0)


def test_the_domain_report_holds_the_stored_log_values_only(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        store.append("gate:g", [started(), block(1, ["u1", "u2"], log_e_value=1000.0)])
        report = read_gate_report(store, "g")
    (first,) = report["blocks"]
    assert set(first) == set(GateReportBlock.__annotations__)
    assert first["log_e_value"] == 1000.0 and "e_value" not in first
    assert (report["status"], report["decision"], report["started_at"].tzinfo is not None) == (
        "running",
        None,
        True,
    )


def test_the_table_shows_an_overflowing_e_value_as_inf(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_store(sqlite_url) as store:
        store.append("gate:g", [started(), block(1, ["u1"], log_e_value=1000.0)])
        assert gate_report(store, "g") == 0
    assert " inf " in capsys.readouterr().out


def test_json_e_value_is_null_only_for_infinity() -> None:
    assert json_e_value(math.inf) is None
    assert json_e_value(1e308) == 1e308 and json_e_value(0.0) == 0.0
