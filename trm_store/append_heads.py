"""What an append reads under the writer lock, in one statement: the log's head, its first
stream's version, the projections' epoch (`trm_store.schema.PROJECTION_EPOCH`), and every
projection's checkpoint row unless the epoch is the one the append already knows (from which
`trm_store.projection_runner.ProjectionSet.follow` decides who applies the append inline).

The rows come back as one row per projection, each carrying the heads and the epoch; one row
with no projection when the epoch is known (most appends: the rows are as the last one found
them) or `projection_state` is empty: a plain join that both databases run with no write, in
one snapshot. The same SQL serves both backends: sent to the driver on SQLite
(`trm_store.driver`), prepared once per writer connection on PostgreSQL (`trm_store.postgres`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection

from trm_store.driver import DriverSql, fetch_all
from trm_store.errors import StoreError

__all__ = [
    "HEADS",
    "HEADS_PREPARABLE",
    "NO_EPOCH",
    "AppendHeads",
    "CheckpointRow",
    "append_heads",
    "heads",
]

_HEADS = (
    "SELECT h.head, h.version, h.epoch, p.name, p.version, p.checkpoint FROM"
    " (SELECT (SELECT coalesce(max(position), 0) FROM events) AS head,"
    " (SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = {stream})"
    " AS version,"
    " (SELECT epoch FROM projection_epoch WHERE id = 1) AS epoch) AS h"
    " LEFT JOIN projection_state AS p ON h.epoch <> {known}"
)
HEADS = DriverSql(_HEADS.format(stream=":s", known=":k"))
HEADS_PREPARABLE = _HEADS.format(stream="$1", known="$2")
"""The statement with PostgreSQL's positional parameters, for a `PREPARE ... (text, bigint) AS`."""

NO_EPOCH = -1
"""The epoch an append sends when it knows none: never one the database holds (migration 0006
draws each one in [0, 2**53))."""

CheckpointRow = Sequence[Any]
"""A projection's row as an append reads it, the statement's row as it came: the two heads and
the epoch, then the projection's name, version, and checkpoint as stored (it may be
`trm_store.schema.FOLLOWING`). Not sliced: it is read in every append that reads rows."""


class AppendHeads(NamedTuple):
    """The log's head, the first stream's version, the projections' epoch and their rows, read
    under the writer lock; no rows when the epoch was the one asked with (or there are none)."""

    log_head: int
    stream_version: int
    epoch: int
    checkpoints: Sequence[CheckpointRow]


def append_heads(rows: Sequence[Sequence[Any]]) -> AppendHeads:
    """The statement's rows (`HEADS`) as AppendHeads; StoreError, the append's transaction
    then rolled back, if the epoch's row is gone (a change the append could not see)."""
    first = rows[0]
    if first[2] is None:
        raise StoreError(
            "nothing written: the row of projection_epoch is gone (deleted outside trm), so "
            "an append cannot tell whether the projections' rows changed; `alembic downgrade "
            "0005` then `alembic upgrade head` makes it again"
        )
    checkpoints = rows if first[3] is not None else ()  # one row of NULLs: no projection's
    return AppendHeads(first[0], first[1], first[2], checkpoints)  # integers on both drivers


def heads(conn: Connection, stream_id: str, known_epoch: int) -> AppendHeads:
    """Read them on `conn`, in its transaction (which holds the writer lock); the projections'
    rows only if their epoch is not `known_epoch`."""
    return append_heads(fetch_all(conn, HEADS, {"s": stream_id, "k": known_epoch}))
