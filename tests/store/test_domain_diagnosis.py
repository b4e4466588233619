"""Diagnoses (seed task 10): one event per diagnosis, and --retry-uncertain semantics."""

from __future__ import annotations

import pytest

from trm_store import open_store
from trm_store.domain.diagnosis import done_question_ids, read_diagnoses, record_diagnosis


def test_retry_uncertain_leaves_uncertain_questions_to_diagnose_again(store_url: str) -> None:
    """Seed task 10: done ids include uncertain questions, unless retry_uncertain=True."""
    with open_store(store_url) as store:
        record_diagnosis(store, run_id="base", question_id="q1", tier="T2", detail={"why": "x"})
        record_diagnosis(store, run_id="base", question_id="q2", tier="uncertain")
        record_diagnosis(store, run_id="base", question_id="q3", tier="T0")
        record_diagnosis(store, run_id="other", question_id="q4", tier="T1")
        assert done_question_ids(store, "base") == {"q1", "q2", "q3"}
        assert done_question_ids(store, "base", retry_uncertain=True) == {"q1", "q3"}
        assert done_question_ids(store, "nobody") == set()


def test_rediagnosing_replaces_the_tier_while_the_log_keeps_both(store_url: str) -> None:
    with open_store(store_url) as store:
        record_diagnosis(store, run_id="base", question_id="q2", tier="uncertain")
        record_diagnosis(store, run_id="base", question_id="q2", tier="T3", detail=["retry"])
        diagnoses = read_diagnoses(store, "base")
        assert (diagnoses["q2"]["tier"], diagnoses["q2"]["detail"]) == ("T3", ["retry"])
        assert diagnoses["q2"]["attempts"] == 2
        assert done_question_ids(store, "base", retry_uncertain=True) == {"q2"}
        log = store.read_stream("diagnosis:base")
        assert [(e.type, e.data["tier"]) for e in log] == [
            ("diagnosis.question_diagnosed", "uncertain"),
            ("diagnosis.question_diagnosed", "T3"),
        ]
        assert store.verify_projections() == []
        store.rebuild_projections()
        assert read_diagnoses(store, "base") == diagnoses


@pytest.mark.parametrize("count", [1, 4])
def test_each_diagnosis_is_durable_the_moment_it_is_recorded(sqlite_url: str, count: int) -> None:
    """Nothing is held for a write at the end: another process's view sees every diagnosis as
    soon as record_diagnosis returns, so a crash loses at most the one in flight."""
    with open_store(sqlite_url) as writer:
        for i in range(count):
            record_diagnosis(writer, run_id="base", question_id=f"q{i}", tier="T1")
            with open_store(sqlite_url, read_only=True) as reader:
                assert done_question_ids(reader, "base") == {f"q{k}" for k in range(i + 1)}
