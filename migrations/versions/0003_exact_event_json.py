"""Event data and meta as exact JSON text on PostgreSQL.

JSONB normalises numbers: a float written as 1e+16 comes back as the integer 10000000000000000,
and 1e300 as an integer that no longer equals the float written. An event log must read back
exactly what was validated, so PostgreSQL keeps the text (JSON); SQLite already does.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for column in ("data", "meta"):
            op.execute(f"ALTER TABLE events ALTER COLUMN {column} TYPE json USING {column}::json")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for column in ("data", "meta"):
            op.execute(f"ALTER TABLE events ALTER COLUMN {column} TYPE jsonb USING {column}::jsonb")
