"""The append-only event log and projection bookkeeping.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_POSITION = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

_SQLITE_GUARDS = [
    """CREATE TRIGGER events_no_update BEFORE UPDATE ON events
       BEGIN SELECT RAISE(ABORT, 'events are append-only: UPDATE refused'); END""",
    """CREATE TRIGGER events_no_delete BEFORE DELETE ON events
       BEGIN SELECT RAISE(ABORT, 'events are append-only: DELETE refused'); END""",
]
_POSTGRES_GUARDS = [
    """CREATE FUNCTION trm_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN RAISE EXCEPTION 'events are append-only: % refused', TG_OP; END $$""",
    """CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
       FOR EACH ROW EXECUTE FUNCTION trm_events_append_only()""",
    """CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
       FOR EACH STATEMENT EXECUTE FUNCTION trm_events_append_only()""",
]


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("position", _POSITION, primary_key=True, autoincrement=False),
        sa.Column("event_id", sa.String(36), nullable=False),
        sa.Column("stream_id", sa.String(255), nullable=False),
        sa.Column("stream_version", sa.Integer, nullable=False),
        sa.Column("type", sa.String(128), nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("data", _JSON, nullable=False),
        sa.Column("meta", _JSON, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("event_id", name="uq_events_event_id"),
        sa.UniqueConstraint("stream_id", "stream_version", name="uq_events_stream_version"),
    )
    op.create_index("ix_events_type", "events", ["type"])
    op.create_table(
        "projection_state",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("checkpoint", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    guards = _POSTGRES_GUARDS if op.get_bind().dialect.name == "postgresql" else _SQLITE_GUARDS
    for statement in guards:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_no_truncate ON events")
        op.execute("DROP TRIGGER IF EXISTS events_append_only ON events")
        op.execute("DROP FUNCTION IF EXISTS trm_events_append_only()")
    op.drop_table("projection_state")
    op.drop_index("ix_events_type", table_name="events")
    op.drop_table("events")
