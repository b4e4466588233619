"""The queries a browser needs that no command had: the workspaces, one page of a run's
predictions (filtered, sorted, counted in SQL), a run's totals.

Each reads one projection with an indexed filter and a LIMIT, never the log, so a page costs
the same on a store of a million events as on a small one. Rows are decoded by the same
functions the other queries use (`prediction_row`, `as_utc`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from sqlalchemy import case, func, select

from trm_store.domain._common import as_utc, check_id, check_int
from trm_store.domain.errors import DomainInputError
from trm_store.domain.metrics import PROJECTION as METRICS
from trm_store.domain.metrics import metric_row
from trm_store.domain.runs import PROJECTION as RUNS
from trm_store.domain.runs import prediction_row
from trm_store.domain.workspace import PROJECTION as WORKSPACES
from trm_store.vocabulary import INFRA_STOP_REASONS, STOP_REASONS

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = [
    "PREDICTION_SORTS",
    "PredictionsPage",
    "final_metrics",
    "list_workspaces",
    "predictions_page",
    "run_totals",
]

PREDICTION_SORTS = ("seq", "question_id", "unit_id", "correct", "stop_reason")
"""The columns a page of predictions sorts by (`seq`: the order questions were first seen)."""

PAGE_MAX = 500


class PredictionsPage(TypedDict):
    """One page of a run's predictions: `total` matches the filter, `rows` is this page."""

    run_id: str
    total: int
    offset: int
    limit: int
    rows: list[dict[str, Any]]


def list_workspaces(store: Store) -> list[dict[str, Any]]:
    """Every workspace, most recently updated first: its id, fields, best, times, version and
    the number of runs recorded in it."""
    with store.query(WORKSPACES) as (conn, tables):
        workspaces, runs = tables["workspaces"], tables["runs"]
        counts = (
            select(runs.c.workspace_id, func.count().label("n"))
            .group_by(runs.c.workspace_id)
            .subquery()
        )
        rows = conn.execute(
            select(workspaces, counts.c.n)
            .select_from(
                workspaces.outerjoin(counts, counts.c.workspace_id == workspaces.c.workspace_id)
            )
            .order_by(workspaces.c.updated_at.desc(), workspaces.c.workspace_id)
        ).all()
    return [
        {
            "workspace_id": r.workspace_id,
            "fields": r.fields,
            "best": r.best,
            "created_at": as_utc(r.created_at),
            "updated_at": as_utc(r.updated_at),
            "version": r.version,
            "runs": r.n or 0,
        }
        for r in rows
    ]


def predictions_page(
    store: Store,
    run_id: str,
    *,
    unit_id: str | None = None,
    correct: bool | None = None,
    stop_reason: str | None = None,
    sort: Literal["seq", "question_id", "unit_id", "correct", "stop_reason"] = "seq",
    descending: bool = False,
    offset: int = 0,
    limit: int = 50,
) -> PredictionsPage:
    """The run's predictions matching every filter given (`correct=None`: any), sorted by
    `sort` (ties in first-seen order), `limit` (at most 500) from `offset`, with the total."""
    check_id("run_id", run_id)
    if unit_id is not None:
        check_id("unit_id", unit_id)
    if correct is not None and not isinstance(correct, bool):
        raise DomainInputError(f"correct must be True, False or None, got {correct!r:.80}")
    if not isinstance(descending, bool):
        raise DomainInputError(f"descending must be a bool, got {descending!r:.80}")
    if stop_reason is not None and stop_reason not in STOP_REASONS:
        raise DomainInputError(
            f"stop_reason must be one of {', '.join(sorted(STOP_REASONS))}, got {stop_reason!r:.80}"
        )
    if sort not in PREDICTION_SORTS:
        raise DomainInputError(
            f"sort must be one of {', '.join(PREDICTION_SORTS)}, got {sort!r:.80}"
        )
    check_int("offset", offset, minimum=0)
    check_int("limit", limit, minimum=1)
    if limit > PAGE_MAX:
        raise DomainInputError(f"limit must be at most {PAGE_MAX}, got {limit}")
    with store.query(RUNS) as (conn, tables):
        predictions = tables["predictions"]
        where = [predictions.c.run_id == run_id]
        if unit_id is not None:
            where.append(predictions.c.unit_id == unit_id)
        if correct is not None:
            where.append(predictions.c.correct == correct)
        if stop_reason is not None:
            where.append(predictions.c.stop_reason == stop_reason)
        total = conn.execute(
            select(func.count()).select_from(predictions).where(*where)
        ).scalar_one()
        key = predictions.c[sort]
        # Missing verdicts (INFRA) sort first ascending and last descending on both backends
        # (their defaults differ); ties keep first-seen order.
        first = key.desc().nulls_last() if descending else key.asc().nulls_first()
        order = [first, predictions.c.seq]
        rows = conn.execute(
            select(predictions).where(*where).order_by(*order).offset(offset).limit(limit)
        ).all()
    return {
        "run_id": run_id,
        "total": total,
        "offset": offset,
        "limit": limit,
        "rows": [prediction_row(r) for r in rows],
    }


def run_totals(store: Store, run_id: str) -> dict[str, Any]:
    """The run's predictions counted in SQL: total, judged, correct, accuracy over judged
    questions (None with none judged), INFRA ones, and the count per stop reason."""
    check_id("run_id", run_id)
    with store.query(RUNS) as (conn, tables):
        predictions = tables["predictions"]
        by_reason = {
            reason: n
            for reason, n in conn.execute(
                select(predictions.c.stop_reason, func.count())
                .where(predictions.c.run_id == run_id)
                .group_by(predictions.c.stop_reason)
            )
        }
        correct = conn.execute(
            select(
                func.coalesce(func.sum(case((predictions.c.correct.is_(True), 1), else_=0)), 0)
            ).where(predictions.c.run_id == run_id)
        ).scalar_one()
    infra = sum(n for reason, n in by_reason.items() if reason in INFRA_STOP_REASONS)
    total = sum(by_reason.values())
    judged = total - infra
    return {
        "predictions": total,
        "judged": judged,
        "correct": int(correct),
        "accuracy": round(int(correct) / judged, 6) if judged else None,
        "infra": infra,
        "stop_reasons": dict(sorted(by_reason.items())),
    }


def final_metrics(store: Store, run_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The `final` dual metrics of these runs, in the order they were recorded: one query for
    a workspace's whole history instead of one per run."""
    if isinstance(run_ids, str) or not isinstance(run_ids, Sequence):
        raise DomainInputError(f"run_ids must be a sequence of run ids, got {run_ids!r:.80}")
    ids = [check_id("run_id", run_id) for run_id in run_ids]
    with store.query(METRICS) as (conn, tables):
        table = tables["dual_metrics"]
        rows = conn.execute(
            select(table)
            .where(table.c.run_id.in_(ids), table.c.version_kind == "final")
            .order_by(table.c.position)
        ).all()
    return [metric_row(r) for r in rows]
