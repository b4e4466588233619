"""Runs and their predictions (seed task 8): events on `run:{id}` and the `runs` projection.

Event types: `run.registered`, `run.prediction_recorded`, `run.completed`, `run.failed`. Writing
goes through `RunLog` (`run_log`); liveness through leases (`run_leases`). This module holds the
events, the read model and the queries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

from pydantic import AwareDatetime, Field, JsonValue, model_validator
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    func,
    select,
    update,
)

from trm_store.domain._common import (
    DomainModel,
    as_utc,
    check_id,
    present,
    row_by_key,
    stream_id,
    update_rows,
    upsert,
)
from trm_store.domain.errors import UnknownRunError
from trm_store.events import RecordedEvent, register_event_type
from trm_store.projections import Projection, register_projection
from trm_store.schema import RUN_LEASES, JsonColumn
from trm_store.vocabulary import outcome_problem

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["prediction_row", "read_predictions", "run_info"]

STREAM = "run"
PROJECTION = "runs"
ERROR_MAX = 4000
"""Longest error text kept in a `failed` event (the start of the message and exception type)."""


class Registered(DomainModel):
    started_at: AwareDatetime
    config: dict[str, JsonValue] | None
    host: str
    pid: int = Field(ge=0, lt=2**31)
    """A pid_t: what the lease check may signal (`os.kill` refuses wider ones)."""


class PredictionRecorded(DomainModel):
    question_id: str = Field(min_length=1, max_length=255)
    unit_id: str = Field(min_length=1, max_length=255)
    prediction: JsonValue
    correct: bool | None
    stop_reason: str = Field(min_length=1, max_length=64)
    fields: dict[str, JsonValue]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        problem = outcome_problem(self.correct, self.stop_reason)
        if problem is not None:
            raise ValueError(problem)
        return self


class Completed(DomainModel):
    finished_at: AwareDatetime


class Failed(DomainModel):
    finished_at: AwareDatetime
    reason: Literal["error", "stale", "operator"]
    """`error`: the block raised; `stale`: its process is gone (`mark_stale_runs`); `operator`:
    failed by hand (`fail_run`, `trm runs --fail`)."""
    error: str = Field(max_length=ERROR_MAX)


REGISTERED = "run.registered"
PREDICTION_RECORDED = "run.prediction_recorded"
COMPLETED = "run.completed"
FAILED = "run.failed"

register_event_type(REGISTERED, Registered)
register_event_type(PREDICTION_RECORDED, PredictionRecorded)
register_event_type(COMPLETED, Completed)
register_event_type(FAILED, Failed)

PREDICTION_KEYS = frozenset(
    {"run_id", "question_id", "unit_id", "prediction", "correct", "stop_reason"}
)
"""Names a prediction's free-form fields may not use."""


class RunsProjection(Projection):
    """`runs`: one row per run (status, times, config, stream version, how many questions it
    predicted); `predictions`: the latest prediction per (run, question), in the order first
    recorded. The count is kept on the run's row so a listing of runs reads no predictions (a
    million-event store holds ~830,000)."""

    name: ClassVar[str] = PROJECTION
    version: ClassVar[int] = 3  # 3: runs.predictions (issue 18)
    event_types: ClassVar[frozenset[str]] = frozenset(
        {REGISTERED, PREDICTION_RECORDED, COMPLETED, FAILED}
    )

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        runs = Table(
            f"runs{suffix}",
            metadata,
            Column("run_id", String(255), primary_key=True),
            Column("status", String(16), nullable=False),
            Column("started_at", DateTime(timezone=True), nullable=False),
            Column("finished_at", DateTime(timezone=True), nullable=True),
            Column("config", JsonColumn, nullable=True),
            Column("host", String(255), nullable=False),
            Column("pid", Integer, nullable=False),
            Column("reason", String(16), nullable=True),
            Column("error", Text, nullable=True),
            Column("version", Integer, nullable=False),
            Column("last_event_at", DateTime(timezone=True), nullable=False),
            Column("predictions", BigInteger, nullable=False),  # questions predicted
        )
        Index(f"ix_runs_status{suffix}", runs.c.status)
        predictions = Table(
            f"predictions{suffix}",
            metadata,
            Column("run_id", String(255), primary_key=True),
            Column("question_id", String(255), primary_key=True),
            Column("seq", Integer, nullable=False),
            Column("unit_id", String(255), nullable=False),
            Column("prediction", JsonColumn, nullable=True),
            Column("correct", Boolean, nullable=True),
            Column("stop_reason", String(64), nullable=False),
            Column("fields", JsonColumn, nullable=False),
        )
        return {"runs": runs, "predictions": predictions}

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        runs, predictions = tables["runs"], tables["predictions"]
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        versions: dict[str, int] = {}
        for event in events:
            run_id = event.stream_id.removeprefix(_STREAM_PREFIX)
            versions[run_id] = event.version
            if event.type == PREDICTION_RECORDED:
                key = (run_id, event.data["question_id"])
                # A re-recorded question keeps its first position (`seq`), however the events
                # are batched: set on insert here and never updated by the upsert.
                seq = rows[key]["seq"] if key in rows else event.version
                rows[key] = {"run_id": run_id, "seq": seq, **event.data}
            else:
                # In order: a run may register, end and register again within one batch.
                self._change_run(conn, runs, predictions, run_id, event)
        _count_new(conn, tables, rows)
        upsert(conn, predictions, list(rows.values()), keys=_PREDICTION_KEY, update=_PREDICTED)
        update_rows(
            conn, runs, [{"run_id": r, "version": v} for r, v in versions.items()], _RUN_KEY
        )

    @staticmethod
    def _change_run(
        conn: Connection, runs: Table, predictions: Table, run_id: str, event: RecordedEvent
    ) -> None:
        data = event.data
        touched: dict[str, Any] = {"last_event_at": event.recorded_at, "version": event.version}
        if event.type == REGISTERED:
            row = {
                "run_id": run_id,
                "status": "running",
                "started_at": datetime.fromisoformat(data["started_at"]),
                "finished_at": None,
                "config": data["config"],
                "host": data["host"],
                "pid": data["pid"],
                "reason": None,
                "error": None,
                # Kept by a re-registration (not in `_REREGISTERED`); a first one counts any
                # predictions recorded before it.
                "predictions": conn.execute(
                    select(func.count()).where(predictions.c.run_id == run_id)
                ).scalar_one(),
                **touched,
            }
            # A resumed run keeps the time it first started: everything else is replaced.
            upsert(conn, runs, [row], keys=_RUN_KEY, update=_REREGISTERED)
            return
        finished = datetime.fromisoformat(data["finished_at"])
        if event.type == COMPLETED:
            ended = {"status": "completed", "finished_at": finished}
        else:
            ended = {
                "status": "failed",
                "finished_at": finished,
                "reason": data["reason"],
                "error": data["error"],
            }
        update_rows(conn, runs, [{"run_id": run_id, **ended, **touched}], _RUN_KEY)


def _count_new(
    conn: Connection, tables: Mapping[str, Table], rows: Mapping[tuple[str, str], Any]
) -> None:
    """Add to each run's `predictions` the questions of `rows` it had not predicted yet (one
    primary-key read per run in the batch: a re-recorded question is not counted again)."""
    runs, predictions = tables["runs"], tables["predictions"]
    asked: dict[str, list[str]] = {}
    for run_id, question_id in rows:
        asked.setdefault(run_id, []).append(question_id)
    for run_id, questions in asked.items():
        seen = len(present(conn, predictions, "question_id", questions, run_id=run_id))
        if len(questions) > seen:
            conn.execute(
                update(runs)
                .where(runs.c.run_id == run_id)
                .values(predictions=runs.c.predictions + (len(questions) - seen))
            )


_STREAM_PREFIX = f"{STREAM}:"
_RUN_KEY = ("run_id",)
_REREGISTERED = (
    "status",
    "finished_at",
    "config",
    "host",
    "pid",
    "reason",
    "error",
    "last_event_at",
    "version",
)
"""What a registration sets on a run already registered (all but its start)."""
_PREDICTION_KEY = ("run_id", "question_id")
_PREDICTED = ("unit_id", "prediction", "correct", "stop_reason", "fields")


register_projection(RunsProjection())


def run_info(store: Store, run_id: str) -> dict[str, Any]:
    """The run as recorded: status (running / completed / failed), started_at, finished_at,
    config, host, pid, reason and error of a failure, predictions recorded, last heartbeat."""
    check_id("run_id", run_id)
    with store.query(PROJECTION) as (conn, tables):
        runs = tables["runs"]
        row = conn.execute(select(runs).where(runs.c.run_id == run_id)).first()
        if row is None:
            raise UnknownRunError(f"no run {run_id!r} was registered")
        heartbeat = conn.execute(
            select(RUN_LEASES.c.heartbeat_at).where(RUN_LEASES.c.run_id == run_id)
        ).scalar_one_or_none()
    return {
        "run_id": run_id,
        "status": row.status,
        "started_at": as_utc(row.started_at),
        "finished_at": None if row.finished_at is None else as_utc(row.finished_at),
        "config": row.config,
        "host": row.host,
        "pid": row.pid,
        "reason": row.reason,
        "error": row.error,
        "predictions": row.predictions,
        "heartbeat_at": None if heartbeat is None else as_utc(heartbeat),
    }


def require_run(store: Store, run_id: str) -> None:
    """UnknownRunError unless `run_id` was registered (runs are never deleted, so a check
    before an append that names the run suffices)."""
    if row_by_key(store, PROJECTION, "runs", "run_id", check_id("run_id", run_id)) is None:
        raise UnknownRunError(f"no run {run_id!r} was registered: register it with RunLog first")


def run_version(store: Store, run_id: str) -> int | None:
    """The run's stream version as the `runs` projection holds it (None: never registered)."""
    row = row_by_key(store, PROJECTION, "runs", "run_id", run_id)
    return None if row is None else int(row.version)


def read_predictions(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The run's predictions (latest per question), in the order the questions were first seen."""
    check_id("run_id", run_id)
    with store.query(PROJECTION) as (conn, tables):
        predictions = tables["predictions"]
        rows = conn.execute(
            select(predictions).where(predictions.c.run_id == run_id).order_by(predictions.c.seq)
        ).all()
    return [prediction_row(r) for r in rows]


def prediction_row(row: Any) -> dict[str, Any]:
    """A `predictions` row as the read API gives it: its extra fields, then the known ones."""
    return {
        **row.fields,
        "question_id": row.question_id,
        "unit_id": row.unit_id,
        "prediction": row.prediction,
        "correct": row.correct,
        "stop_reason": row.stop_reason,
    }


def stream_of(run_id: str) -> str:
    """The run's stream id."""
    return stream_id(STREAM, run_id)
