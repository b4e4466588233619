"""Indexes for the reads of issue 16: some types in log order, and stream-id prefixes.

`(type)` alone made PostgreSQL sort every matching row to read a type in position order;
`(type, position)` reads one type's events in order and stops at the batch's LIMIT (on SQLite
the old index held the rowid already; the new one is the same there). Stream ids compare in the
"C" collation on PostgreSQL, so a prefix is one range of the (stream_id, stream_version) index
whatever the database's locale (SQLite's BINARY collation already is code point order).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_events_type", table_name="events")
    op.create_index("ix_events_type_position", "events", ["type", "position"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute('ALTER TABLE events ALTER COLUMN stream_id TYPE varchar(255) COLLATE "C"')


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute('ALTER TABLE events ALTER COLUMN stream_id TYPE varchar(255) COLLATE "default"')
    op.drop_index("ix_events_type_position", table_name="events")
    op.create_index("ix_events_type", "events", ["type"])
