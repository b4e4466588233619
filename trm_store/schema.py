"""The tables alembic owns: the event log and the projections' bookkeeping.

Projection tables themselves are not here: they are derived, disposable, and created by the
projection runner at the projection's version.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect

from trm_store.json_codec import dumps_json, loads_json

__all__ = [
    "EVENTS",
    "FOLLOWING",
    "METADATA",
    "PROJECTION_EPOCH",
    "PROJECTION_STATE",
    "RUN_LEASES",
    "JsonColumn",
]

METADATA = MetaData()


class JsonColumn(TypeDecorator[Any]):
    """A projection's JSON value, kept exactly: the log's canonical JSON text in a TEXT column.

    Not the database's JSON types: SQLite gives a JSON column NUMERIC affinity (the text `1.0`
    reads back as the integer 1, `-0.0` as 0, 2**63 as a float) and PostgreSQL's JSONB keeps
    numbers as numeric (`1e16` reads back as an int, `1e300` as a 301-digit one). Canonical text
    (`dumps_json`: sorted keys, one spelling per value) is also comparable, so live and rebuilt
    tables can be diffed in SQL. SQL NULL stands for None.
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else dumps_json(value, what="JSON column value")

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else loads_json(value)


Position = BigInteger().with_variant(Integer(), "sqlite")

StreamId = String(255).with_variant(String(255, collation="C"), "postgresql")
"""Compared by code point on both backends (SQLite's BINARY, PostgreSQL's "C"): a stream-prefix
read is then one range of the (stream_id, stream_version) index, whatever the database's locale."""

EVENTS = Table(
    "events",
    METADATA,
    Column("position", Position, primary_key=True, autoincrement=False),
    Column("event_id", String(36), nullable=False),
    Column("stream_id", StreamId, nullable=False),
    Column("stream_version", Integer, nullable=False),
    Column("type", String(128), nullable=False),
    Column("schema_version", Integer, nullable=False),
    # Plain JSON, also on PostgreSQL: JSONB would normalise numbers (1e16 reads back as an int).
    Column("data", JSON(), nullable=False),
    Column("meta", JSON(), nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    # Each index serves a query (tests/store/test_event_indexes.py shows which, by query plan):
    # event ids: exactly-once appends; (stream, version): stream reads and heads, prefix reads;
    # (type, position): reads of some types in log order (a projection's, `read_all(types=)`).
    UniqueConstraint("event_id", name="uq_events_event_id"),
    UniqueConstraint("stream_id", "stream_version", name="uq_events_stream_version"),
    Index("ix_events_type_position", "type", "position"),
)

EVENT_COLUMNS = tuple(column.name for column in EVENTS.c)
"""The events table's columns in order, for the backends' bulk insert."""

FOLLOWING = -1
"""A checkpoint that follows the log: the projection has applied every event, and every append
applies its events to it inline, in the append's transaction, until an append by code that does
not run it (another version, or none) sets its checkpoint to the head it had reached
(`trm_store.projection_runner.ProjectionSet.follow`). It spares every append an UPDATE of every
projection's row; readers see the log's head instead (`trm_store.projection_state.statuses`)."""

PROJECTION_STATE = Table(
    "projection_state",
    METADATA,
    Column("name", String(128), primary_key=True),
    Column("version", Integer, nullable=False),
    Column("checkpoint", BigInteger, nullable=False),
    Column("status", String(16), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    CheckConstraint(f"checkpoint >= {FOLLOWING}", name="ck_projection_state_checkpoint"),
)
"""One row per projection: version built, last position applied (or `FOLLOWING`), `ready` or
`rebuilding`."""

PROJECTION_EPOCH = Table(
    "projection_epoch",
    METADATA,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("epoch", BigInteger, nullable=False),
    CheckConstraint("id = 1", name="ck_projection_epoch_one_row"),
)
"""One row whose `epoch` changes, to a new random value, with every statement that writes
`projection_state` (triggers, migration 0006): an append reads it, not every projection's row,
to learn that those rows are as it last found them (`trm_store.append_heads`)."""

RUN_LEASES = Table(
    "run_leases",
    METADATA,
    Column("run_id", String(255), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False),
)
"""Liveness of running runs: mutable on purpose, so it lives outside the append-only log."""
