"""Property: any sequence of domain commands leaves every projection equal to a rebuild."""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trm_store import Store, open_store
from trm_store.domain.baseline import BaselineCache
from trm_store.domain.diagnosis import done_question_ids, read_diagnoses, record_diagnosis
from trm_store.domain.errors import DomainConflictError, InfraOutcomeError, UnknownEntityError
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

WORKSPACES, RUNS, SNAPSHOTS, UNITS = ("w0", "w1"), ("r0", "r1", "r2"), ("s0", "s1"), ("u0", "u1")
QUESTIONS = tuple(f"q{i}" for i in range(5))
EXPECTED = (DomainConflictError, UnknownEntityError, InfraOutcomeError)
"""Refusals a random sequence may provoke (a second final, an unknown workspace, ...)."""

json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-1000, 1000),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(st.characters(codec="utf-8", categories=("L", "N", "P", "Zs")), max_size=6),
)
question = st.tuples(
    st.sampled_from(QUESTIONS), st.booleans(), st.sampled_from(["stop", "length", "error"])
).map(lambda q: (q[0], None if q[2] == "error" else q[1], q[2]))  # INFRA has no verdict
commands = st.one_of(
    st.tuples(st.just("scaffold"), st.sampled_from(WORKSPACES), json_scalar),
    st.tuples(
        st.just("update"),
        st.sampled_from(WORKSPACES),
        st.sampled_from(["skills", "note", "k"]),
        json_scalar,
    ),
    st.tuples(
        st.just("record_run"), st.sampled_from(WORKSPACES), st.sampled_from(RUNS), json_scalar
    ),
    st.tuples(st.just("best"), st.sampled_from(WORKSPACES), json_scalar),
    st.tuples(
        st.just("run"),
        st.sampled_from(RUNS),
        st.lists(question, max_size=6),
        st.integers(1, 3),
        st.booleans(),
    ),
    st.tuples(st.just("dead_run"), st.sampled_from(RUNS)),
    st.tuples(
        st.just("metric"),
        st.sampled_from(RUNS),
        st.integers(0, 2),
        st.sampled_from(["final", "slow_candidate"]),
        st.sampled_from(["val", "test"]),
        st.floats(0, 1),
    ),
    st.tuples(
        st.just("cache"),
        st.sampled_from(SNAPSHOTS),
        st.sampled_from(UNITS),
        st.lists(question, min_size=1, max_size=3, unique_by=lambda q: q[0]),
    ),
    st.tuples(st.just("invalidate"), st.sampled_from(SNAPSHOTS)),
    st.tuples(
        st.just("diagnose"),
        st.sampled_from(RUNS),
        st.sampled_from(QUESTIONS),
        st.sampled_from(["T0", "T1", "uncertain"]),
    ),
)


def _run(store: Store, ns: str, command: tuple[Any, ...]) -> None:
    kind, *args = command
    if kind == "scaffold":
        scaffold_workspace(store, ns + args[0], skills="s", prompts="p", extra=args[1])
    elif kind == "update":
        update_manifest(store, ns + args[0], **{args[1]: args[2]})
    elif kind == "record_run":
        record_run(store, ns + args[0], ns + args[1], value=args[2])
    elif kind == "best":
        update_best(store, ns + args[0], value=args[1])
    elif kind == "run":
        run_id, questions, batch_size, fails = args
        try:
            with RunLog(store, ns + run_id, batch_size=batch_size) as log:
                for qid, correct, reason in questions:
                    log.record_prediction(
                        qid, unit_id="u", prediction=qid, correct=correct, stop_reason=reason
                    )
                if fails:
                    raise ZeroDivisionError("block failed")
        except ZeroDivisionError:
            pass
    elif kind == "dead_run":
        RunLog(store, ns + args[0]).__enter__()
        mark_stale_runs(store, timedelta(days=1), now=datetime.now(UTC) + timedelta(days=2))
    elif kind == "metric":
        run_id, epoch, version_kind, pool, acc = args
        write_dual_metric(
            store,
            run_id=ns + run_id,
            epoch=epoch,
            version_kind=version_kind,
            skills_version="v",
            prompts_version="v",
            pool=pool,
            hard_acc=acc,
        )
    elif kind == "cache":
        snapshot, unit, questions = args
        results = [{"question_id": q, "correct": c, "stop_reason": r} for q, c, r in questions]
        score = sum(bool(c) for _, c, _ in questions) / len(questions)
        outcome = {"score": score, "n_questions": len(questions), "results": results}
        BaselineCache(store).put(ns + snapshot, unit, outcome)
    elif kind == "invalidate":
        BaselineCache(store).invalidate(ns + args[0])
    else:
        record_diagnosis(store, run_id=ns + args[0], question_id=args[1], tier=args[2])


def _views(store: Store, ns: str) -> dict[str, Any]:
    """Everything the facades answer about this example's entities."""
    views: dict[str, Any] = {}
    for ws in WORKSPACES:
        try:
            views[f"manifest {ws}"] = get_manifest(store, ns + ws)
        except UnknownEntityError:
            views[f"manifest {ws}"] = None
    for run in RUNS:
        try:
            views[f"run {run}"] = run_info(store, ns + run)
            views[f"predictions {run}"] = RunLog(store, ns + run, register_run=False).predictions()
        except UnknownEntityError:
            views[f"run {run}"] = None
        views[f"metrics {run}"] = read_dual_metric(store, run_id=ns + run)
        views[f"done {run}"] = done_question_ids(store, ns + run)
        views[f"retry {run}"] = done_question_ids(store, ns + run, retry_uncertain=True)
        views[f"diagnoses {run}"] = read_diagnoses(store, ns + run)
    cache = BaselineCache(store)
    for snapshot in SNAPSHOTS:
        for unit in UNITS:
            views[f"cache {snapshot} {unit}"] = cache.get(ns + snapshot, unit)
    return views


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=st.lists(commands, min_size=1, max_size=14))
def test_projections_equal_a_rebuild_after_any_command_sequence(
    store_url: str, program: list[tuple[Any, ...]]
) -> None:
    ns = uuid.uuid4().hex[:8] + "-"  # examples share the store; each has its own entities
    with open_store(store_url) as store:
        for command in program:
            with contextlib.suppress(*EXPECTED):
                _run(store, ns, command)
        live = _views(store, ns)
        assert store.verify_projections() == []
        store.rebuild_projections()
        assert _views(store, ns) == live
