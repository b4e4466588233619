"""Dual metrics (seed task 9): one `metrics.dual_metric_recorded` event per row on
`metrics:{run_id}`, read back from the `dual_metrics` projection.

`version_kind` says which version of skills/prompts was measured: `final` is the epoch's accepted
version (at most one per run, epoch and pool), `slow_candidate` a slow-update candidate that may be
reverted. The "one final" rule is enforced three times over: a read check for a clear error, an
append that expects the stream version that check saw, and a partial unique index in the
projection, applied in the append's own transaction, so even a raw append of a second final rolls
back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    select,
)
from sqlalchemy.exc import IntegrityError

from trm_store.domain._common import (
    Count,
    DomainModel,
    Real,
    as_utc,
    check_id,
    check_int,
    stream_id,
    validated,
)
from trm_store.domain.errors import DuplicateFinalMetricError
from trm_store.domain.runs import require_run
from trm_store.errors import ConcurrencyError
from trm_store.events import NewEvent, RecordedEvent, register_event_type
from trm_store.projections import Projection, register_projection

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["VERSION_KINDS", "metric_row", "read_dual_metric", "write_dual_metric"]

STREAM = "metrics"
PROJECTION = "dual_metrics"
VERSION_KINDS = ("final", "slow_candidate")
_RETRIES = 5


class DualMetricRecorded(DomainModel):
    epoch: Count
    version_kind: Literal["final", "slow_candidate"]
    skills_version: str = Field(min_length=1, max_length=255)
    prompts_version: str = Field(min_length=1, max_length=255)
    pool: str = Field(min_length=1, max_length=255)
    hard_acc: Real = Field(ge=0.0, le=1.0)
    soft_score: Real | None
    mixed_score: Real | None


DUAL_METRIC_RECORDED = "metrics.dual_metric_recorded"
register_event_type(DUAL_METRIC_RECORDED, DualMetricRecorded)


class DualMetricsProjection(Projection):
    """`dual_metrics`: one row per recorded metric, keyed by log position."""

    name: ClassVar[str] = PROJECTION
    version: ClassVar[int] = 2
    event_types: ClassVar[frozenset[str]] = frozenset({DUAL_METRIC_RECORDED})

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        table = Table(
            f"dual_metrics{suffix}",
            metadata,
            Column("position", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
            Column("run_id", String(255), nullable=False),
            Column("epoch", BigInteger, nullable=False),
            Column("version_kind", String(16), nullable=False),
            Column("skills_version", String(255), nullable=False),
            Column("prompts_version", String(255), nullable=False),
            Column("pool", String(255), nullable=False),
            Column("hard_acc", Float, nullable=False),
            Column("soft_score", Float, nullable=True),
            Column("mixed_score", Float, nullable=True),
            Column("recorded_at", DateTime(timezone=True), nullable=False),
        )
        is_final = table.c.version_kind == "final"
        Index(
            f"uq_dual_metrics_final{suffix}",
            table.c.run_id,
            table.c.epoch,
            table.c.pool,
            unique=True,
            sqlite_where=is_final,
            postgresql_where=is_final,
        )
        Index(f"ix_dual_metrics_run{suffix}", table.c.run_id, table.c.epoch)
        return {"dual_metrics": table}

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        rows = [
            {
                "position": e.position,
                "run_id": e.stream_id.removeprefix(f"{STREAM}:"),
                "recorded_at": e.recorded_at,
                **e.data,
            }
            for e in events
        ]
        try:
            conn.execute(insert(tables["dual_metrics"]), rows)
        except IntegrityError as e:
            finals = sorted(
                {(r["run_id"], r["epoch"], r["pool"]) for r in rows if r["version_kind"] == "final"}
            )
            raise DuplicateFinalMetricError(
                f"a final dual metric exists already for (run, epoch, pool) among {finals}; "
                "nothing was written"
            ) from e


register_projection(DualMetricsProjection())


def write_dual_metric(
    store: Store,
    *,
    run_id: str,
    epoch: int,
    version_kind: str,
    skills_version: str,
    prompts_version: str,
    pool: str,
    hard_acc: float,
    soft_score: float | None = None,
    mixed_score: float | None = None,
) -> None:
    """Record one dual metric. A second `final` for (run_id, epoch, pool) raises
    DuplicateFinalMetricError; bad input raises DomainInputError; either way nothing is written."""
    check_id("run_id", run_id)
    data = {
        "epoch": epoch,
        "version_kind": version_kind,
        "skills_version": skills_version,
        "prompts_version": prompts_version,
        "pool": pool,
        "hard_acc": hard_acc,
        "soft_score": soft_score,
        "mixed_score": mixed_score,
    }
    metric = validated(DualMetricRecorded, data, f"dual metric of run {run_id!r}")
    require_run(store, run_id)  # a metric measures a run: a dangling id would measure nothing
    event = NewEvent(DUAL_METRIC_RECORDED, metric.model_dump())
    for attempt in range(_RETRIES):
        version, has_final = _state(store, run_id, metric)
        if has_final:
            raise DuplicateFinalMetricError(
                f"run {run_id!r} has a final dual metric for epoch {epoch} on pool {pool!r} "
                "already; record a re-measured candidate as version_kind='slow_candidate'"
            )
        try:
            store.append(stream_id(STREAM, run_id), [event], expected_version=version)
            return
        except ConcurrencyError:
            # Another writer recorded a metric for this run meanwhile: check again.
            if attempt == _RETRIES - 1:
                raise


def _state(store: Store, run_id: str, metric: DualMetricRecorded) -> tuple[int, bool]:
    """(the run's metric stream version, whether the metric's final slot is taken)."""
    with store.query(PROJECTION) as (conn, tables):
        table = tables["dual_metrics"]
        of_run = table.c.run_id == run_id
        version = conn.execute(select(func.count()).where(of_run)).scalar_one()
        taken = (
            metric.version_kind == "final"
            and conn.execute(
                select(func.count()).where(
                    of_run,
                    table.c.epoch == metric.epoch,
                    table.c.pool == metric.pool,
                    table.c.version_kind == "final",
                )
            ).scalar_one()
        )
    return int(version), bool(taken)


def read_dual_metric(
    store: Store, *, run_id: str, epoch: int | None = None
) -> list[dict[str, Any]]:
    """The run's dual metrics (one epoch's, or all), in the order they were recorded."""
    check_id("run_id", run_id)
    if epoch is not None:
        check_int("epoch", epoch, minimum=0)
    with store.query(PROJECTION) as (conn, tables):
        table = tables["dual_metrics"]
        query = select(table).where(table.c.run_id == run_id).order_by(table.c.position)
        if epoch is not None:
            query = query.where(table.c.epoch == epoch)
        rows = conn.execute(query).all()
    return [metric_row(r) for r in rows]


def metric_row(row: Any) -> dict[str, Any]:
    """A `dual_metrics` row as the read API gives it."""
    return {
        "run_id": row.run_id,
        "epoch": row.epoch,
        "version_kind": row.version_kind,
        "skills_version": row.skills_version,
        "prompts_version": row.prompts_version,
        "pool": row.pool,
        "hard_acc": row.hard_acc,
        "soft_score": row.soft_score,
        "mixed_score": row.mixed_score,
        "recorded_at": as_utc(row.recorded_at),
    }
