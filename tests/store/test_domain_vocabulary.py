"""One vocabulary, validated everywhere (issue 14.10): the run log and the baseline cache refuse
unknown stop reasons and inconsistent (correct, stop_reason) pairs; metrics and workspaces refuse
runs never registered; manifest facades raise typed errors only. Nothing is written on refusal."""

from __future__ import annotations

import json
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trm_store import (
    BaselineCache,
    DomainInputError,
    EventValidationError,
    ManifestExportError,
    NewEvent,
    RunLog,
    Store,
    StoreError,
    UnknownRunError,
    export_manifest,
    open_store,
    record_run,
    scaffold_workspace,
    update_manifest,
    write_dual_metric,
)
from trm_store.domain.runs import PREDICTION_RECORDED
from trm_store.vocabulary import INFRA_STOP_REASONS, STOP_REASONS, outcome_problem


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as s:
        yield s


CORRECT = st.sampled_from([True, False, None])
REASON = st.one_of(
    st.sampled_from(sorted(STOP_REASONS)), st.sampled_from(["banana", "ERROR", "Stop", ""])
)


def test_the_rule_is_infra_without_a_verdict_and_the_rest_with_one() -> None:
    for reason in sorted(STOP_REASONS):
        for correct in (True, False, None):
            consistent = (correct is None) == (reason in INFRA_STOP_REASONS)
            assert (outcome_problem(correct, reason) is None) == consistent, (correct, reason)
    assert outcome_problem(True, "banana") is not None
    assert outcome_problem(1, "stop") is not None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(correct=CORRECT, reason=REASON)
def test_the_run_log_accepts_exactly_the_consistent_pairs(
    store: Store, correct: bool | None, reason: str
) -> None:
    with RunLog(store, f"r-{uuid.uuid4().hex}", batch_size=1) as log:
        head = store.head_position()
        if outcome_problem(correct, reason) is None:
            log.record_prediction(
                "q", unit_id="u", prediction="A", correct=correct, stop_reason=reason
            )
            assert store.head_position() == head + 1
        else:
            with pytest.raises(DomainInputError):
                log.record_prediction(
                    "q", unit_id="u", prediction="A", correct=correct, stop_reason=reason
                )
            assert store.head_position() == head


@pytest.mark.parametrize(
    ("correct", "reason"),
    [(True, "banana"), (None, "stop"), (True, "error"), (False, "parse_error")],
)
def test_a_raw_append_of_an_inconsistent_prediction_is_refused(
    store: Store, correct: bool | None, reason: str
) -> None:
    data = {
        "question_id": "q",
        "unit_id": "u",
        "prediction": None,
        "correct": correct,
        "stop_reason": reason,
        "fields": {},
    }
    with pytest.raises(EventValidationError):
        store.append("run:raw", [NewEvent(PREDICTION_RECORDED, data)])
    assert store.head_position() == 0


@pytest.mark.parametrize("reason", ["ERROR", "banana", "Stop"])
def test_the_baseline_cache_refuses_an_unknown_stop_reason(store: Store, reason: str) -> None:
    outcome = {
        "score": 1.0,
        "n_questions": 1,
        "results": [{"question_id": "q", "correct": True, "stop_reason": reason}],
    }
    with pytest.raises(DomainInputError, match="unknown stop_reason"):
        BaselineCache(store).put("snap", "u", outcome)
    assert store.head_position() == 0


METRIC: dict[str, Any] = {
    "epoch": 1,
    "version_kind": "final",
    "skills_version": "v1",
    "prompts_version": "v1",
    "pool": "val",
    "hard_acc": 0.5,
}


def test_a_metric_or_a_workspace_run_of_a_run_never_registered_is_refused(store: Store) -> None:
    scaffold_workspace(store, "ws", skills="s", prompts="p")
    head = store.head_position()
    with pytest.raises(UnknownRunError):
        write_dual_metric(store, run_id="ghost", **METRIC)
    with pytest.raises(UnknownRunError):
        record_run(store, "ws", "ghost", epoch=1)
    assert store.head_position() == head
    with RunLog(store, "real"):
        pass
    write_dual_metric(store, run_id="real", **METRIC)
    record_run(store, "ws", "real", epoch=1)


def test_a_manifest_change_named_workspace_id_is_a_typed_error(store: Store) -> None:
    scaffold_workspace(store, "ws", skills="s", prompts="p")
    head = store.head_position()
    with pytest.raises(DomainInputError, match="workspace_id"):
        update_manifest(store, "ws", workspace_id="other")
    with pytest.raises(DomainInputError, match="workspace_id"):
        scaffold_workspace(store, "ws2", skills="s", prompts="p", workspace_id="x")
    with pytest.raises(DomainInputError, match="run_id"):
        record_run(store, "ws", "r", run_id="x")
    assert store.head_position() == head


def test_exporting_into_a_missing_directory_is_a_typed_error(store: Store, tmp_path: Path) -> None:
    scaffold_workspace(store, "ws", skills="s", prompts="p")
    with pytest.raises(ManifestExportError, match="does not exist"):
        export_manifest(store, "ws", tmp_path / "missing" / "manifest.json")
    blocked = tmp_path / "ro"
    blocked.mkdir()
    blocked.chmod(0o500)
    try:
        with pytest.raises(StoreError):  # no permission (unless root, who may write anyway)
            export_manifest(store, "ws", blocked / "m.json")
            if (blocked / "m.json").exists():
                raise ManifestExportError("written as root")
    finally:
        blocked.chmod(0o700)
    assert list((tmp_path).glob("**/.m.json.*.tmp")) == []


def test_exporting_through_a_symlink_or_onto_a_fifo(store: Store, tmp_path: Path) -> None:
    """The atomic write renamed a file over the path: a symlink became a regular file (the file
    it named left stale) and a FIFO (or a device, as root) was replaced by a file."""
    scaffold_workspace(store, "ws", skills="s", prompts="p")
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    link.symlink_to(real)
    assert export_manifest(store, "ws", link) == link
    assert link.is_symlink() and json.loads(real.read_text())["workspace_id"] == "ws"
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ManifestExportError, match="not a regular file"):
        export_manifest(store, "ws", fifo)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
