"""Bad input to every domain facade: DomainInputError (an EventValidationError), nothing written."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from trm_store import EventValidationError, Store, open_store
from trm_store.domain.baseline import BaselineCache
from trm_store.domain.diagnosis import done_question_ids, read_diagnoses, record_diagnosis
from trm_store.domain.errors import DomainInputError
from trm_store.domain.manifest_file import export_manifest
from trm_store.domain.metrics import read_dual_metric, write_dual_metric
from trm_store.domain.run_leases import mark_stale_runs
from trm_store.domain.run_log import RunLog
from trm_store.domain.runs import run_info
from trm_store.domain.workspace import (
    get_manifest,
    record_run,
    scaffold_workspace,
    update_best,
    update_manifest,
)

NAN, INF = float("nan"), float("inf")
Call = Callable[[Store], Any]

METRIC: dict[str, Any] = {
    "run_id": "r",
    "epoch": 1,
    "version_kind": "final",
    "skills_version": "v1",
    "prompts_version": "v1",
    "pool": "val",
    "hard_acc": 0.5,
}


def _metric(**bad: Any) -> Call:
    return lambda s: write_dual_metric(s, **{**METRIC, **bad})


def _enter(log: Callable[[Store], RunLog]) -> Call:
    return lambda s: log(s).__enter__()


CASES: dict[str, Call] = {
    # workspaces
    "scaffold: empty id": lambda s: scaffold_workspace(s, "", skills="s", prompts="p"),
    "scaffold: blank id": lambda s: scaffold_workspace(s, "  ", skills="s", prompts="p"),
    "scaffold: id not a str": lambda s: scaffold_workspace(s, 5, skills="s", prompts="p"),  # type: ignore[arg-type]
    "scaffold: id too long": lambda s: scaffold_workspace(s, "w" * 201, skills="s", prompts="p"),
    "scaffold: control char": lambda s: scaffold_workspace(s, "w\n", skills="s", prompts="p"),
    "scaffold: skills None": lambda s: scaffold_workspace(s, "w2", skills=None, prompts="p"),
    "scaffold: not JSON": lambda s: scaffold_workspace(s, "w2", skills=object(), prompts="p"),
    "scaffold: NaN field": lambda s: scaffold_workspace(s, "w2", skills="s", prompts="p", x=NAN),
    "scaffold: reserved": lambda s: scaffold_workspace(s, "w2", skills="s", prompts="p", runs=[]),
    "update: no change": lambda s: update_manifest(s, "ws"),
    "update: reserved": lambda s: update_manifest(s, "ws", version=3),
    "update: int key": lambda s: update_manifest(s, "ws", note={1: 2}),
    "update: inf": lambda s: update_manifest(s, "ws", score=INF),
    "record_run: empty run": lambda s: record_run(s, "ws", ""),
    "record_run: NaN": lambda s: record_run(s, "ws", "r9", score=NAN),
    "record_run: bytes": lambda s: record_run(s, "ws", "r9", blob=b"x"),
    "best: nothing": lambda s: update_best(s, "ws"),
    "best: tuple key": lambda s: update_best(s, "ws", x={(1,): 2}),
    "get_manifest: None": lambda s: get_manifest(s, None),  # type: ignore[arg-type]
    "export: empty id": lambda s: export_manifest(s, "", Path("unused")),
    # runs
    "RunLog: empty id": lambda s: RunLog(s, ""),
    "RunLog: batch 0": lambda s: RunLog(s, "x", batch_size=0),
    "RunLog: batch bool": lambda s: RunLog(s, "x", batch_size=True),
    "RunLog: register str": lambda s: RunLog(s, "x", register_run="no"),  # type: ignore[arg-type]
    "RunLog: config unregistered": lambda s: RunLog(s, "r", register_run=False, config={}),
    "RunLog: NaN config": _enter(lambda s: RunLog(s, "x", config={"lr": NAN})),
    "RunLog: list config": _enter(lambda s: RunLog(s, "x", config=[1])),  # type: ignore[arg-type]
    "RunLog: naive clock": _enter(lambda s: RunLog(s, "x", clock=datetime.now)),
    "run_info: empty": lambda s: run_info(s, ""),
    "stale: not a timedelta": lambda s: mark_stale_runs(s, 5),  # type: ignore[arg-type]
    "stale: negative": lambda s: mark_stale_runs(s, timedelta(seconds=-1)),
    "stale: naive now": lambda s: mark_stale_runs(s, timedelta(1), now=datetime(2026, 1, 1)),
    # dual metrics
    "metric: unknown kind": _metric(version_kind="best"),
    "metric: NaN acc": _metric(hard_acc=NAN),
    "metric: acc > 1": _metric(hard_acc=1.5),
    "metric: acc str": _metric(hard_acc="0.5"),
    "metric: acc bool": _metric(hard_acc=True),
    "metric: inf soft": _metric(soft_score=INF),
    "metric: epoch -1": _metric(epoch=-1),
    "metric: epoch bool": _metric(epoch=True),
    "metric: epoch float": _metric(epoch=1.0),
    "metric: empty run": _metric(run_id=""),
    "metric: empty pool": _metric(pool=""),
    "metric: version int": _metric(skills_version=2),
    "read metric: epoch str": lambda s: read_dual_metric(s, run_id="r", epoch="1"),  # type: ignore[arg-type]
    # baseline cache
    "baseline put: empty snapshot": lambda s: BaselineCache(s).put("", "u", {}),
    "baseline put: unit int": lambda s: BaselineCache(s).put("snap", 3, {}),  # type: ignore[arg-type]
    "baseline get: empty unit": lambda s: BaselineCache(s).get("snap", ""),
    "baseline invalidate: empty": lambda s: BaselineCache(s).invalidate(""),
    "baseline invalidate: reason int": lambda s: BaselineCache(s).invalidate("snap", reason=5),  # type: ignore[arg-type]
    # diagnoses
    "diagnosis: empty run": lambda s: record_diagnosis(s, run_id="", question_id="q", tier="T1"),
    "diagnosis: empty question": lambda s: record_diagnosis(
        s, run_id="r", question_id="", tier="T1"
    ),
    "diagnosis: empty tier": lambda s: record_diagnosis(s, run_id="r", question_id="q", tier=""),
    "diagnosis: tier int": lambda s: record_diagnosis(s, run_id="r", question_id="q", tier=3),  # type: ignore[arg-type]
    "diagnosis: NaN detail": lambda s: record_diagnosis(
        s, run_id="r", question_id="q", tier="T1", detail={"p": NAN}
    ),
    "done: empty run": lambda s: done_question_ids(s, ""),
    "done: retry str": lambda s: done_question_ids(s, "r", retry_uncertain="yes"),  # type: ignore[arg-type]
    "read diagnoses: int": lambda s: read_diagnoses(s, 1),  # type: ignore[arg-type]
}

PREDICTION_CASES: dict[str, dict[str, Any]] = {
    "empty question": {"question_id": ""},
    "unit None": {"unit_id": None},
    "correct str": {"correct": "yes"},
    "correct int": {"correct": 1},
    "empty stop_reason": {"stop_reason": ""},
    "stop_reason int": {"stop_reason": 0},
    "prediction set": {"prediction": {"A"}},
    "NaN field": {"latency_ms": NAN},
    "reserved field": {"run_id": "other"},
}


@pytest.fixture
def populated(store_url: str) -> Any:
    with open_store(store_url) as store:
        scaffold_workspace(store, "ws", skills="s", prompts="p")
        with RunLog(store, "r") as log:
            log.record_prediction(
                "q", unit_id="u", prediction="A", correct=True, stop_reason="stop"
            )
        write_dual_metric(store, **METRIC)
        yield store


def test_bad_input_is_a_typed_error_and_writes_nothing(
    populated: Store, subtests: pytest.Subtests
) -> None:
    head = populated.head_position()
    for case in sorted(CASES):
        with subtests.test(case=case):
            with pytest.raises(DomainInputError) as caught:
                CASES[case](populated)
            assert isinstance(caught.value, EventValidationError)
            assert populated.head_position() == head
    assert populated.verify_projections() == []


def test_a_bad_prediction_is_refused_before_it_can_spoil_a_batch(
    populated: Store, subtests: pytest.Subtests
) -> None:
    good: dict[str, Any] = {
        "unit_id": "u",
        "prediction": "A",
        "correct": True,
        "stop_reason": "stop",
    }
    with RunLog(populated, "r2", batch_size=2, flush_interval_s=None) as log:
        log.record_prediction("q1", **good)
        head = populated.head_position()
        for case in sorted(PREDICTION_CASES):
            with subtests.test(case=case), pytest.raises(DomainInputError):
                log.record_prediction(**{"question_id": "q2", **good, **PREDICTION_CASES[case]})
        assert populated.head_position() == head
        assert log.flush() == 1  # the good prediction is still buffered, alone
    predictions = RunLog(populated, "r2", register_run=False).predictions()
    assert [p["question_id"] for p in predictions] == ["q1"]
