"""A projection's checkpoint may follow the log: `-1` (`trm_store.schema.FOLLOWING`).

Every append used to UPDATE the row of every projection at the head, to move its checkpoint on
by the append's events: on PostgreSQL ~40% of the server's work for a 1-event append (callgrind:
~200,000 of ~500,000 instructions), and a new version of every row each time. A row that
follows the log moves with it and is written only when that stops. Older trm code would read
`-1` as a position and replay the whole log into the projection: this revision makes it refuse
the database ("newer than this trm knows"), and the CHECK constraint keeps any other negative
value out.

Downgrade writes each following checkpoint as the log's head, the position it stands for.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "ck_projection_state_checkpoint"


def upgrade() -> None:
    with op.batch_alter_table("projection_state") as table:
        table.create_check_constraint(_NAME, "checkpoint >= -1")


def downgrade() -> None:
    op.execute(
        "UPDATE projection_state SET checkpoint ="
        " (SELECT coalesce(max(position), 0) FROM events) WHERE checkpoint = -1"
    )
    with op.batch_alter_table("projection_state") as table:
        table.drop_constraint(_NAME, type_="check")
