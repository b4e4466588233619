"""Read models keep values exactly (issue 14 point 5): a value read from any projection equals, in
type and value, the value its event holds in the log, on SQLite and PostgreSQL, live and after a
rebuild. Floats keep their sign (-0.0), whole floats stay floats (1.0, 1e16, 1e300) and ints stay
ints, however wide (2**63, 2**70: free-form JSON is text, not a database number).

A float field that a projection keeps in a FLOAT column (a metric, a latency, a log e-value) is
recorded as 0.0 for -0.0 (SQLite's REAL columns drop the sign): the event holds what the column
gives back, so the rule holds there too.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trm_store import NewEvent, Store, open_store
from trm_store.domain.baseline import BaselineCache
from trm_store.domain.diagnosis import read_diagnoses, record_diagnosis
from trm_store.domain.gates import BLOCK_EVALUATED, STARTED, gate_info, gate_stream
from trm_store.domain.llm_calls import breaker_transitions, llm_call, llm_stream
from trm_store.domain.llm_calls.models import BREAKER_CHANGED, CALL_COMPLETED
from trm_store.domain.metrics import read_dual_metric, write_dual_metric
from trm_store.domain.run_log import RunLog
from trm_store.domain.workspace import (
    get_manifest,
    record_run,
    scaffold_workspace,
    update_best,
    update_manifest,
)

EDGES = [1.0, -0.0, 0.0, 1e16, 1e300, -1e-300, 2.5, 2**63, -(2**63) - 1, 2**70, 2**63 - 1]
"""The values the issue saw bent: whole floats, the negative zero, huge floats, wide ints."""

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(EDGES),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6),
)
keys = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)
column_floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([-0.0, 1.0, 1e16, 1e300])
)
"""Floats of typed FLOAT columns (a log e-value)."""
unit_floats = st.one_of(st.floats(0, 1), st.sampled_from([-0.0, 0.0, 1.0]))

SETTINGS = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def same(a: Any, b: Any) -> bool:
    """Equal in type and value, recursively; a float's sign counts (-0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def test_same_tells_types_and_signs_apart() -> None:
    assert same({"a": [1.0, -0.0]}, {"a": [1.0, -0.0]})
    assert not same(1.0, 1)
    assert not same(-0.0, 0.0)
    assert not same([True], [1])
    assert not same(2**63, float(2**63))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as s:
        yield s


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def event_data(store: Store, stream: str, event_type: str) -> list[dict[str, Any]]:
    return [e.data for e in store.read_stream(stream) if e.type == event_type]


def read_twice(store: Store, projection: str, read: Any) -> list[Any]:
    """What `read()` gives live and after a rebuild of `projection` from the log."""
    live = read()
    store.rebuild_projections(projection)
    return [live, read()]


@SETTINGS
@given(value=values, extra=values)
@example(value=EDGES, extra={"x": -0.0})
@example(value=1.0, extra=-0.0)  # bare: SQLite read them back as 1 and 0
@example(value=2**63, extra=1e16)  # bare: SQLite read 2**63 back as a float
def test_run_configs_and_predictions_keep_values(store: Store, value: Any, extra: Any) -> None:
    run_id = new_id("r")
    with RunLog(store, run_id, config={"v": value}) as run:
        run.record_prediction(
            "q", unit_id="u", prediction=value, correct=True, stop_reason="stop", extra=extra
        )
    (registered,) = event_data(store, f"run:{run_id}", "run.registered")
    (predicted,) = event_data(store, f"run:{run_id}", "run.prediction_recorded")
    assert same(registered["config"], {"v": value}) and same(predicted["prediction"], value)
    for info, predictions in read_twice(
        store,
        "runs",
        lambda: (RunLog(store, run_id, register_run=False).info(), _predictions(store, run_id)),
    ):
        assert same(info["config"], registered["config"])
        (row,) = predictions
        assert same(row["prediction"], predicted["prediction"])
        assert same(row["extra"], predicted["fields"]["extra"])


def _predictions(store: Store, run_id: str) -> list[dict[str, Any]]:
    return RunLog(store, run_id, register_run=False).predictions()


@SETTINGS
@given(skills=values, note=values, changed=values, score=values, best=values)
@example(skills=1.0, note=-0.0, changed=1e16, score=1e300, best=2**63)
def test_manifests_keep_values(
    store: Store, skills: Any, note: Any, changed: Any, score: Any, best: Any
) -> None:
    skills = [skills]  # skills and prompts may not be None
    workspace, run_id = new_id("w"), new_id("r")
    with RunLog(store, run_id):
        pass
    scaffold_workspace(store, workspace, skills=skills, prompts={"p": note}, note=note)
    update_manifest(store, workspace, changed=changed)
    record_run(store, workspace, run_id, score=score)
    record_run(store, workspace, run_id, again=score)  # merged over the first, in the projection
    update_best(store, workspace, value=best)
    stream = f"workspace:{workspace}"
    (scaffolded,) = event_data(store, stream, "workspace.scaffolded")
    (updated,) = event_data(store, stream, "workspace.manifest_updated")
    recorded = event_data(store, stream, "workspace.run_recorded")
    (best_event,) = event_data(store, stream, "workspace.best_updated")
    for manifest in read_twice(store, "workspaces", lambda: get_manifest(store, workspace)):
        assert same(manifest["skills"], scaffolded["skills"])
        assert same(manifest["prompts"], scaffolded["prompts"])
        assert same(manifest["note"], scaffolded["fields"]["note"])
        assert same(manifest["changed"], updated["changes"]["changed"])
        (run,) = manifest["runs"]
        assert same(run["score"], recorded[0]["fields"]["score"])
        assert same(run["again"], recorded[1]["fields"]["again"])
        assert same(manifest["best"], best_event["fields"])


@SETTINGS
@given(detail=values)
@example(detail=-0.0)
def test_diagnoses_keep_values(store: Store, detail: Any) -> None:
    run_id = new_id("r")
    record_diagnosis(store, run_id=run_id, question_id="q", tier="t", detail=detail)
    (event,) = event_data(store, f"diagnosis:{run_id}", "diagnosis.question_diagnosed")
    for diagnoses in read_twice(store, "diagnoses", lambda: read_diagnoses(store, run_id)):
        assert same(diagnoses["q"]["detail"], event["detail"])


@SETTINGS
@given(config=values, log_e=column_floats, futility=column_floats)
@example(config=1e16, log_e=-0.0, futility=1e300)
def test_gates_keep_values(store: Store, config: Any, log_e: float, futility: float) -> None:
    gate_id = new_id("g")
    started = {
        "baseline_snapshot": "b",
        "candidate_snapshot": "c",
        "seed": 2**63 - 1,
        "pool_size": 2,
        "config": {"v": config},
    }
    block = {
        "block": 1,
        "unit_ids": ["u"],
        "wins": 1,
        "losses": 0,
        "ties": 0,
        "infra_baseline": [],
        "infra_candidate": [],
        "baseline_cache_hits": 0,
        "log_e_value": log_e,
        "log_futility_e_value": futility,
        "decision": "continue",
    }
    stream = gate_stream(gate_id)
    store.append(stream, [NewEvent(STARTED, started), NewEvent(BLOCK_EVALUATED, block)])
    (start,) = event_data(store, stream, STARTED)
    (evaluated,) = event_data(store, stream, BLOCK_EVALUATED)
    assert same(evaluated["log_e_value"], 0.0 if log_e == 0 else log_e)
    for info in read_twice(store, "gates", lambda: gate_info(store, gate_id)):
        assert same(info["config"], start["config"])
        assert same(info["seed"], start["seed"])
        assert same(info["log_e_value"], evaluated["log_e_value"])
        assert same(info["log_futility_e_value"], evaluated["log_futility_e_value"])


@SETTINGS
@given(hard=unit_floats, soft=st.none() | column_floats, epoch=st.sampled_from([0, 2**63 - 1]))
@example(hard=-0.0, soft=-0.0, epoch=2**31)
def test_dual_metrics_keep_values(
    store: Store, hard: float, soft: float | None, epoch: int
) -> None:
    run_id = new_id("r")
    with RunLog(store, run_id):
        pass
    write_dual_metric(
        store,
        run_id=run_id,
        epoch=epoch,
        version_kind="final",
        skills_version="s",
        prompts_version="p",
        pool="val",
        hard_acc=hard,
        soft_score=soft,
        mixed_score=None,
    )
    (event,) = event_data(store, f"metrics:{run_id}", "metrics.dual_metric_recorded")
    for (row,) in read_twice(store, "dual_metrics", lambda: read_dual_metric(store, run_id=run_id)):
        for name in ("epoch", "hard_acc", "soft_score", "mixed_score"):
            assert same(row[name], event[name]), name


@SETTINGS
@given(latency=column_floats.map(abs), ttft=st.none() | column_floats.map(abs), at=column_floats)
@example(latency=-0.0, ttft=1e300, at=-0.0)
def test_llm_calls_keep_values(store: Store, latency: float, ttft: float | None, at: float) -> None:
    source, call_id = new_id("s"), new_id("c")
    attempt = {
        "n": 1,
        "outcome": "retry",
        "reason": "timeout",
        "status": 200,
        "latency_ms": latency,
        "tokens_discarded": 2**40 - 1,
        "sleep_s": None,
    }
    call = {
        "call_id": call_id,
        "parent_call_id": None,
        "model": "m",
        "endpoint": "http://127.0.0.1:1/v1",
        "profile": "p",
        "cache": "miss",
        "cache_salt": None,
        "cache_write": None,
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 2**63 - 1, "completion_tokens": 2**63, "total_tokens": 1.0},
        "ttft_ms": ttft,
        "max_inter_token_ms": None,
        "latency_ms": latency,
        "attempts": [attempt, {**attempt, "n": 2, "outcome": "ok", "reason": None}],
    }
    breaker = {"from_state": "closed", "to_state": "open", "failures": 2**63 - 1}
    stream = llm_stream(source)
    store.append(
        stream,
        [
            NewEvent(CALL_COMPLETED, call),
            NewEvent(BREAKER_CHANGED, {**breaker, "at": at, "call_id": None}),
        ],
    )
    (event,) = event_data(store, stream, CALL_COMPLETED)
    (changed,) = event_data(store, stream, BREAKER_CHANGED)
    for row, (transition,) in read_twice(
        store,
        "llm_calls",
        lambda: (llm_call(store, call_id), breaker_transitions(store, source=source)),
    ):
        assert same(row["latency_ms"], event["latency_ms"])
        assert same(row["ttft_ms"], event["ttft_ms"])
        assert same(row["attempt_reasons"], ["timeout"])
        assert same(row["tokens_discarded"], 2 * (2**40 - 1))
        # Token counts a BIGINT holds are kept; others (too wide, not ints) are no count.
        assert (row["prompt_tokens"], row["completion_tokens"], row["total_tokens"]) == (
            2**63 - 1,
            None,
            None,
        )
        assert same(transition["at"], changed["at"])
        assert same(transition["failures"], changed["failures"])
    assert store.verify_projections() == []


def test_a_baseline_score_of_negative_zero_reads_back_as_recorded(store: Store) -> None:
    results = [{"question_id": "q", "correct": False, "stop_reason": "stop"}]
    outcome = {"unit_id": "u", "score": -0.0, "n_questions": 1, "results": results}
    BaselineCache(store).put("s", "u", outcome)
    (event,) = event_data(store, "baseline:s", "baseline.unit_cached")
    assert same(event["score"], 0.0)  # the sign SQLite's REAL column would drop is not recorded
    for cached in read_twice(store, "baseline_cache", lambda: BaselineCache(store).get("s", "u")):
        assert cached is not None and same(cached.score, event["score"])
        assert same(cached.model_dump(mode="json")["results"], event["results"])
