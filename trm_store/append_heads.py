"""What an append reads under the writer lock, in one statement: the log's head, its first
stream's version, and every projection's checkpoint row (from which
`trm_store.projection_runner.ProjectionSet.follow` decides who applies the append inline).

The rows come back as one row per projection, each carrying the two heads (one row with none
when `projection_state` is empty): a plain join that both databases run with no write. The same
SQL serves both backends: sent to the driver on SQLite (`trm_store.driver`), prepared once per
writer connection on PostgreSQL (`trm_store.postgres`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection

from trm_store.driver import DriverSql, fetch_all

__all__ = ["HEADS", "HEADS_PREPARABLE", "AppendHeads", "CheckpointRow", "append_heads", "heads"]

_HEADS = (
    "SELECT h.head, h.version, p.name, p.version, p.checkpoint FROM"
    " (SELECT (SELECT coalesce(max(position), 0) FROM events) AS head,"
    " (SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = {stream})"
    " AS version) AS h"
    " LEFT JOIN projection_state AS p ON 1 = 1"
)
HEADS = DriverSql(_HEADS.format(stream=":s"))
HEADS_PREPARABLE = _HEADS.format(stream="$1")
"""The statement with PostgreSQL's positional parameter, for a `PREPARE ... (text) AS`."""


CheckpointRow = Sequence[Any]
"""A projection's row as an append reads it, the statement's row as it came: the two heads,
then the projection's name, version, and checkpoint as stored (it may be
`trm_store.schema.FOLLOWING`). Not sliced: it is read in every append."""


class AppendHeads(NamedTuple):
    """The log's head, the first stream's version and the projections' rows, read under the
    writer lock."""

    log_head: int
    stream_version: int
    checkpoints: Sequence[CheckpointRow]


def append_heads(rows: Sequence[Sequence[Any]]) -> AppendHeads:
    """The statement's rows (`HEADS`) as AppendHeads."""
    first = rows[0]
    checkpoints = rows if first[2] is not None else ()  # one row of NULLs: no projection
    return AppendHeads(int(first[0]), int(first[1]), checkpoints)


def heads(conn: Connection, stream_id: str) -> AppendHeads:
    """Read them on `conn`, in its transaction (which holds the writer lock)."""
    return append_heads(fetch_all(conn, HEADS, {"s": stream_id}))
