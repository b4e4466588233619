"""`projection_epoch`: one number that changes whenever `projection_state` is written.

Every append read every projection's row under the writer lock, to learn whether each still
follows the log (`trm_store.projection_runner.ProjectionSet.follow`): with trm's eight domain
projections, eight rows of five columns, which CPython 3.11's sqlite3 module fetches letting go
of the GIL and taking it again once a column, under the writer lock. An append now reads this
row's `epoch` and gets the projections' rows only when it differs from the epoch at which it
last decided who follows (`trm_store.append_heads`): a single-event append on SQLite went from
~362,000 to ~318,000 instructions (callgrind), the statement alone from 8.3 to 4.1 us (timeit).

Triggers change it, so that no writer of `projection_state` (trm's code, an older trm, a user's
SQL) can forget to: SQLite's after each row, PostgreSQL's before each statement (TRUNCATE
included), firing even where triggers are off for replication (`ENABLE ALWAYS`: a logical
replication apply worker, `session_replication_role = replica`). Each change draws a new random
value, never the last one plus one: a database swapped for another one, or for a backup of
itself restored, then written again, cannot come back to the number a store knows but by a
chance of about one in 2**52 (PostgreSQL's `random()` has 52 random bits).

PostgreSQL's trigger runs before its statement touches a row of `projection_state`: every
writer of it takes the epoch's row first, so that one row cannot deadlock two transactions
that write `projection_state` rows in different orders (an append's `follow` and a user's
repair, say); taken after the rows, it would. The epoch's row is all a user's transaction
waits for: it takes no lock of trm's.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RANDOM = {  # a value in [0, 2**53): never -1, which an append sends for "none known yet"
    "sqlite": "abs(random() % 9007199254740992)",
    "postgresql": "floor(random() * 9007199254740992)::bigint",
}
_SET = "UPDATE {schema}projection_epoch SET epoch = {random} WHERE id = 1"
_SQLITE_TRIGGERS = [  # a trigger's statements name tables of its own table's database
    f"CREATE TRIGGER projection_epoch_after_{verb.lower()} AFTER {verb} ON projection_state"
    f" BEGIN {_SET.format(schema='', random=_RANDOM['sqlite'])}; END"
    for verb in ("INSERT", "UPDATE", "DELETE")
]
# The table named in the trigger's own schema: a session whose search_path leads elsewhere
# (psql writing `<schema>.projection_state`) must not move, or miss, another schema's epoch.
_POSTGRES_TRIGGERS = [
    "CREATE FUNCTION trm_projection_epoch_bump() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN EXECUTE format("
    f"'{_SET.format(schema='%I.', random=_RANDOM['postgresql'])}', TG_TABLE_SCHEMA);"
    " RETURN NULL; END $$",
    "CREATE TRIGGER projection_epoch_bump"
    " BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON projection_state"
    " FOR EACH STATEMENT EXECUTE FUNCTION trm_projection_epoch_bump()",
    "ALTER TABLE projection_state ENABLE ALWAYS TRIGGER projection_epoch_bump",
]


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        "projection_epoch",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.CheckConstraint("id = 1", name="ck_projection_epoch_one_row"),
    )
    op.execute(f"INSERT INTO projection_epoch (id, epoch) VALUES (1, {_RANDOM[dialect]})")
    for statement in _POSTGRES_TRIGGERS if dialect == "postgresql" else _SQLITE_TRIGGERS:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER projection_epoch_bump ON projection_state")
        op.execute("DROP FUNCTION trm_projection_epoch_bump()")
    else:
        for verb in ("insert", "update", "delete"):
            op.execute(f"DROP TRIGGER projection_epoch_after_{verb}")
    op.drop_table("projection_epoch")
