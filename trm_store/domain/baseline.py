"""The baseline cache (seed task 6, store side): a unit's baseline outcome, keyed by (snapshot,
unit_id), as events on `baseline:{snapshot}` (`baseline.unit_cached`, `baseline.invalidated`).

An INFRA outcome (any question ended in `error` or `parse_error`) measures the infrastructure,
not the baseline; cached, it would be replayed as a model failure in every later gate. `put`
refuses it outright, and the event model refuses it too, so not even a raw append can cache one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator
from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    delete,
    func,
    select,
)

from trm_store.domain._common import DomainModel, Real, check_id, stream_id, upsert, validated
from trm_store.domain.errors import DomainInputError, InfraOutcomeError
from trm_store.events import NewEvent, RecordedEvent, register_event_type
from trm_store.projections import Projection, register_projection
from trm_store.schema import JsonColumn
from trm_store.vocabulary import INFRA_STOP_REASONS, outcome_problem

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["BaselineCache", "BaselineOutcome", "BaselineQuestion"]

STREAM = "baseline"
PROJECTION = "baseline_cache"

_Str = Annotated[str, Strict(), Field(min_length=1, max_length=255)]


class BaselineQuestion(BaseModel):
    """One question of a cached unit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    question_id: _Str
    correct: Annotated[bool, Strict()]
    stop_reason: Annotated[str, Strict(), Field(min_length=1, max_length=64)]

    @model_validator(mode="after")
    def _known(self) -> Self:
        problem = outcome_problem(self.correct, self.stop_reason)
        if problem is not None:
            raise ValueError(problem)
        return self


class BaselineOutcome(BaseModel):
    """A baseline unit's outcome: `score` = mean correctness of `results`, `n_questions` of them.

    As a mapping: {"unit_id": str, "score": float in [0, 1], "n_questions": int,
    "results": [{"question_id": str, "correct": bool, "stop_reason": str}, ...]}. No INFRA
    question (stop_reason `error` / `parse_error`) and no missing verdict are allowed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    unit_id: _Str
    score: Annotated[Real, Strict(), Field(ge=0.0, le=1.0)]
    n_questions: Annotated[int, Strict(), Field(ge=1)]
    results: tuple[BaselineQuestion, ...]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        infra = [q.question_id for q in self.results if q.stop_reason in INFRA_STOP_REASONS]
        if infra:
            raise ValueError(f"INFRA question(s) {infra} cannot be part of a baseline outcome")
        if self.n_questions != len(self.results):
            raise ValueError(f"n_questions is {self.n_questions}, results hold {len(self.results)}")
        if len({q.question_id for q in self.results}) != len(self.results):
            raise ValueError("a question appears twice in results")
        mean = sum(q.correct for q in self.results) / len(self.results)
        if not math.isclose(self.score, mean, abs_tol=1e-9):
            raise ValueError(f"score {self.score} is not the mean correctness {mean} of results")
        return self


class Invalidated(DomainModel):
    reason: str | None = Field(default=None, max_length=1000)


UNIT_CACHED = "baseline.unit_cached"
INVALIDATED = "baseline.invalidated"
register_event_type(UNIT_CACHED, BaselineOutcome)
register_event_type(INVALIDATED, Invalidated)


class BaselineCacheProjection(Projection):
    """`baseline_units`: the outcome per (snapshot, unit); invalidation empties the snapshot."""

    name: ClassVar[str] = PROJECTION
    version: ClassVar[int] = 2
    event_types: ClassVar[frozenset[str]] = frozenset({UNIT_CACHED, INVALIDATED})

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        return {
            "units": Table(
                f"baseline_units{suffix}",
                metadata,
                Column("snapshot", String(255), primary_key=True),
                Column("unit_id", String(255), primary_key=True),
                Column("score", Float, nullable=False),
                Column("n_questions", Integer, nullable=False),
                Column("results", JsonColumn, nullable=False),
                Column("cached_at", DateTime(timezone=True), nullable=False),
            )
        }

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        units = tables["units"]
        pending: list[dict[str, Any]] = []
        for event in events:
            snapshot = event.stream_id.removeprefix(f"{STREAM}:")
            if event.type == UNIT_CACHED:
                pending.append({"snapshot": snapshot, "cached_at": event.recorded_at, **event.data})
                continue
            _write(conn, units, pending)
            pending = []
            conn.execute(delete(units).where(units.c.snapshot == snapshot))
        _write(conn, units, pending)


def _write(conn: Connection, units: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    upsert(
        conn,
        units,
        rows,
        keys=("snapshot", "unit_id"),
        update=("score", "n_questions", "results", "cached_at"),
    )


register_projection(BaselineCacheProjection())


class BaselineCache:
    """Baseline outcomes by (snapshot, unit_id). The snapshot key must name everything that
    determines an outcome (prompts/skills versions, model, decoding params, grader version)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def get(self, snapshot: str, unit_id: str) -> BaselineOutcome | None:
        """The cached outcome, or None (never cached, or invalidated since)."""
        check_id("snapshot", snapshot)
        check_id("unit_id", unit_id)
        with self._store.query(PROJECTION) as (conn, tables):
            units = tables["units"]
            row = conn.execute(
                select(units.c.score, units.c.n_questions, units.c.results).where(
                    units.c.snapshot == snapshot, units.c.unit_id == unit_id
                )
            ).first()
        if row is None:
            return None
        return BaselineOutcome(
            unit_id=unit_id, score=row.score, n_questions=row.n_questions, results=row.results
        )

    def put(self, snapshot: str, unit_id: str, outcome: object) -> None:
        """Cache `outcome` for (snapshot, unit_id), replacing any earlier one.

        `outcome` is a BaselineOutcome, any mapping or pydantic model of the same shape, or an
        object whose `to_record()` returns one; `infra: false` and a per-question `unit_id` equal
        to `unit_id` are accepted and dropped. An INFRA outcome raises InfraOutcomeError, any
        other bad outcome DomainInputError; nothing is written either way.
        """
        check_id("snapshot", snapshot)
        check_id("unit_id", unit_id)
        record = _normalise(snapshot, unit_id, outcome)
        checked = validated(BaselineOutcome, record, f"baseline outcome of unit {unit_id!r}")
        self._store.append(
            stream_id(STREAM, snapshot), [NewEvent(UNIT_CACHED, checked.model_dump())]
        )

    def invalidate(self, snapshot: str, *, reason: str | None = None) -> int:
        """Drop every unit cached for `snapshot`; how many there were."""
        check_id("snapshot", snapshot)
        event = validated(Invalidated, {"reason": reason}, "invalidate")
        with self._store.query(PROJECTION) as (conn, tables):
            units = tables["units"]
            count = conn.execute(
                select(func.count()).where(units.c.snapshot == snapshot)
            ).scalar_one()
        self._store.append(stream_id(STREAM, snapshot), [NewEvent(INVALIDATED, event.model_dump())])
        return int(count)


def _normalise(snapshot: str, unit_id: str, outcome: object) -> dict[str, Any]:
    """The outcome as a plain record of BaselineOutcome's shape; INFRA refused first."""
    raw: object = outcome
    if isinstance(outcome, BaseModel):
        raw = outcome.model_dump()
    elif not isinstance(outcome, Mapping) and callable(getattr(outcome, "to_record", None)):
        raw = outcome.to_record()  # type: ignore[attr-defined]
    if not isinstance(raw, Mapping):
        raise DomainInputError(
            f"outcome must be a mapping, a pydantic model or have to_record(), got "
            f"{type(outcome).__name__}"
        )
    record = dict(raw)
    results = record.get("results")
    if isinstance(results, str | bytes) or not isinstance(results, Sequence):
        raise DomainInputError(f"outcome of unit {unit_id!r}: results must be a list")
    questions = []
    for question in results:
        if not isinstance(question, Mapping):
            raise DomainInputError(f"outcome of unit {unit_id!r}: each result must be a mapping")
        questions.append(dict(question))
    infra = [q.get("question_id") for q in questions if q.get("stop_reason") in INFRA_STOP_REASONS]
    if infra or record.get("infra") is True:
        raise InfraOutcomeError(snapshot, unit_id, [str(q) for q in infra])
    if record.pop("infra", False) is not False:
        raise DomainInputError(f"outcome of unit {unit_id!r}: infra must be a bool")
    record.pop("infra_reasons", None)  # the policy a gate folded it under, not the outcome's
    for question in questions:
        if question.pop("unit_id", unit_id) != unit_id:
            raise DomainInputError(f"a result of unit {unit_id!r} names another unit")
    if record.setdefault("unit_id", unit_id) != unit_id:
        raise DomainInputError(f"outcome is for unit {record['unit_id']!r}, not {unit_id!r}")
    record["results"] = questions
    return record
