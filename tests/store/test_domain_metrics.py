"""Dual metrics (seed task 9): `final` vs `slow_candidate`, and at most one final per slot."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from trm_store import NewEvent, RunLog, Store, open_store
from trm_store.domain.errors import DuplicateFinalMetricError
from trm_store.domain.metrics import read_dual_metric, write_dual_metric


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as opened:
        for run_id in ("r", "r2"):  # a metric measures a registered run
            with RunLog(opened, run_id):
                pass
        yield opened


def _metric(**overrides: Any) -> dict[str, Any]:
    metric = {
        "run_id": "r",
        "epoch": 1,
        "version_kind": "final",
        "skills_version": "v1",
        "prompts_version": "v1",
        "pool": "val",
        "hard_acc": 0.7,
    }
    return {**metric, **overrides}


def _without_time(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "recorded_at"} for r in rows]


def test_the_slow_update_candidate_is_not_a_second_final(store: Store) -> None:
    """Seed task 9: the epoch's final row stays unique and unchanged; the slow update's
    re-measured candidate is recorded as slow_candidate."""
    write_dual_metric(store, **_metric(soft_score=0.8, mixed_score=0.75))
    final_before = read_dual_metric(store, run_id="r", epoch=1)
    write_dual_metric(
        store, **_metric(version_kind="slow_candidate", skills_version="v2", hard_acc=0.6)
    )
    rows = read_dual_metric(store, run_id="r", epoch=1)
    assert [r["version_kind"] for r in rows] == ["final", "slow_candidate"]
    finals = [r for r in rows if r["version_kind"] == "final"]
    assert finals == final_before
    assert (finals[0]["hard_acc"], finals[0]["soft_score"], finals[0]["skills_version"]) == (
        0.7, 0.8, "v1",
    )  # fmt: skip
    assert rows[1]["skills_version"] == "v2" and rows[1]["soft_score"] is None


def test_a_second_final_for_the_same_slot_is_refused_and_writes_nothing(store: Store) -> None:
    write_dual_metric(store, **_metric())
    head, before = store.head_position(), read_dual_metric(store, run_id="r")
    with pytest.raises(DuplicateFinalMetricError, match="slow_candidate"):
        write_dual_metric(store, **_metric(hard_acc=0.9, skills_version="v2"))
    assert store.head_position() == head
    assert read_dual_metric(store, run_id="r") == before


def test_the_database_refuses_a_second_final_even_from_a_raw_append(store: Store) -> None:
    """The unique index is applied in the append's transaction: bypassing the facade's read check
    still rolls the whole append back, other streams included."""
    write_dual_metric(store, **_metric())
    head = store.head_position()
    data = {k: v for k, v in _metric(hard_acc=0.1).items() if k != "run_id"}
    data |= {"soft_score": None, "mixed_score": None}
    with pytest.raises(DuplicateFinalMetricError):
        store.append_batch(
            [
                ("metrics:other", [NewEvent("metrics.dual_metric_recorded", data)], None),
                ("metrics:r", [NewEvent("metrics.dual_metric_recorded", data)], None),
            ]
        )
    assert store.head_position() == head
    assert read_dual_metric(store, run_id="other") == []
    assert [r["hard_acc"] for r in read_dual_metric(store, run_id="r")] == [0.7]


def test_finals_of_other_epochs_pools_and_runs_are_independent(store: Store) -> None:
    write_dual_metric(store, **_metric())
    write_dual_metric(store, **_metric(epoch=2))
    write_dual_metric(store, **_metric(pool="test"))
    write_dual_metric(store, **_metric(run_id="r2"))
    write_dual_metric(store, **_metric(version_kind="slow_candidate"))
    write_dual_metric(store, **_metric(version_kind="slow_candidate"))
    rows = read_dual_metric(store, run_id="r")
    assert [(r["epoch"], r["pool"], r["version_kind"]) for r in rows] == [
        (1, "val", "final"),
        (2, "val", "final"),
        (1, "test", "final"),
        (1, "val", "slow_candidate"),
        (1, "val", "slow_candidate"),
    ]
    assert len(read_dual_metric(store, run_id="r", epoch=2)) == 1
    assert _without_time(read_dual_metric(store, run_id="r2")) == [
        {**_metric(run_id="r2"), "soft_score": None, "mixed_score": None}
    ]
    assert store.verify_projections() == []
