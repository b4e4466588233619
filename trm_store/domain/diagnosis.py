"""Diagnoses (seed task 10): each diagnosis is one `diagnosis.question_diagnosed` event on
`diagnosis:{run_id}`, appended the moment it is made, so a crash loses at most the one in flight
(not, as in the code this replaces, every result held for a write at the end of the run).

The `diagnoses` projection keeps the latest tier per (run, question); the log keeps every one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, JsonValue
from sqlalchemy import Column, Connection, DateTime, Integer, MetaData, String, Table, select

from trm_store.domain._common import DomainModel, as_utc, check_id, stream_id, upsert, validated
from trm_store.domain.errors import DomainInputError
from trm_store.events import NewEvent, RecordedEvent, register_event_type
from trm_store.projections import Projection, register_projection
from trm_store.schema import JsonColumn

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["UNCERTAIN", "done_question_ids", "read_diagnoses", "record_diagnosis"]

STREAM = "diagnosis"
PROJECTION = "diagnoses"
UNCERTAIN = "uncertain"
"""The tier of a diagnosis worth retrying (`done_question_ids(..., retry_uncertain=True)`)."""


class QuestionDiagnosed(DomainModel):
    question_id: str = Field(min_length=1, max_length=255)
    tier: str = Field(min_length=1, max_length=64)
    detail: JsonValue = None


QUESTION_DIAGNOSED = "diagnosis.question_diagnosed"
register_event_type(QUESTION_DIAGNOSED, QuestionDiagnosed)


class DiagnosesProjection(Projection):
    """`diagnoses`: the latest diagnosis per (run, question)."""

    name: ClassVar[str] = PROJECTION
    version: ClassVar[int] = 2
    event_types: ClassVar[frozenset[str]] = frozenset({QUESTION_DIAGNOSED})

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        return {
            "diagnoses": Table(
                f"diagnoses{suffix}",
                metadata,
                Column("run_id", String(255), primary_key=True),
                Column("question_id", String(255), primary_key=True),
                Column("tier", String(64), nullable=False),
                Column("detail", JsonColumn, nullable=True),
                Column("diagnosed_at", DateTime(timezone=True), nullable=False),
                Column("attempts", Integer, nullable=False),
            )
        }

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        table = tables["diagnoses"]
        keys = {(e.stream_id.removeprefix(f"{STREAM}:"), e.data["question_id"]) for e in events}
        attempts = dict.fromkeys(keys, 0)
        for run_id, question_id, count in conn.execute(
            select(table.c.run_id, table.c.question_id, table.c.attempts).where(
                table.c.run_id.in_({k[0] for k in keys}),
                table.c.question_id.in_({k[1] for k in keys}),
            )
        ):
            if (run_id, question_id) in attempts:
                attempts[(run_id, question_id)] = count
        rows = []
        for event in events:
            key = (event.stream_id.removeprefix(f"{STREAM}:"), event.data["question_id"])
            attempts[key] += 1
            rows.append(
                {
                    "run_id": key[0],
                    "question_id": key[1],
                    "tier": event.data["tier"],
                    "detail": event.data["detail"],
                    "diagnosed_at": event.recorded_at,
                    "attempts": attempts[key],
                }
            )
        upsert(
            conn,
            table,
            rows,
            keys=("run_id", "question_id"),
            update=("tier", "detail", "diagnosed_at", "attempts"),
        )


register_projection(DiagnosesProjection())


def record_diagnosis(
    store: Store, *, run_id: str, question_id: str, tier: str, detail: Any = None
) -> None:
    """Record one question's diagnosis now (re-diagnosing replaces the tier in the read model)."""
    check_id("run_id", run_id)
    check_id("question_id", question_id)
    data = {"question_id": question_id, "tier": tier, "detail": detail}
    event = validated(QuestionDiagnosed, data, f"diagnosis of {question_id!r}")
    store.append(stream_id(STREAM, run_id), [NewEvent(QUESTION_DIAGNOSED, event.model_dump())])


def done_question_ids(store: Store, run_id: str, *, retry_uncertain: bool = False) -> set[str]:
    """Questions of the run already diagnosed; with retry_uncertain=True, those whose latest
    tier is `uncertain` do not count as done (they will be diagnosed again)."""
    check_id("run_id", run_id)
    if not isinstance(retry_uncertain, bool):
        raise DomainInputError(f"retry_uncertain must be a bool, got {retry_uncertain!r}")
    with store.query(PROJECTION) as (conn, tables):
        table = tables["diagnoses"]
        query = select(table.c.question_id).where(table.c.run_id == run_id)
        if retry_uncertain:
            query = query.where(table.c.tier != UNCERTAIN)
        return set(conn.execute(query).scalars())


def read_diagnoses(store: Store, run_id: str) -> dict[str, dict[str, Any]]:
    """question_id -> latest {tier, detail, diagnosed_at, attempts} for the run."""
    check_id("run_id", run_id)
    with store.query(PROJECTION) as (conn, tables):
        table = tables["diagnoses"]
        rows = conn.execute(select(table).where(table.c.run_id == run_id)).all()
    return {
        r.question_id: {
            "tier": r.tier,
            "detail": r.detail,
            "diagnosed_at": as_utc(r.diagnosed_at),
            "attempts": r.attempts,
        }
        for r in rows
    }
