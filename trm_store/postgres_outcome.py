"""What an error of a PostgreSQL writer's query that carries a `COMMIT` means
(`PostgresWriters.committed`): once it has left, a lost connection or an interrupt leaves the
transaction's outcome unknown, and the error keeps no copy of the query (it holds every value
of an append); an error the server answered with rolled the transaction back, and some such
errors end the append rather than its numbering by the database."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError

__all__ = ["LAST_QUERY_HIDDEN", "MAY_HAVE_COMMITTED", "final", "hide_or_note", "sent"]

LAST_QUERY_HIDDEN = (
    "-- the query carrying a transaction's COMMIT (PostgresWriters.committed): its text is not kept"
)
"""The statement of the error raised when a connection is lost once that query left (its
outcome unknown), in place of the query's text."""
MAY_HAVE_COMMITTED = "the transaction's query with its COMMIT had left: it may have been written"


def hide_or_note(e: BaseException) -> None:
    """Once a query carrying a `COMMIT` has left: a database error keeps no copy of it (it
    holds every value of the append), and an interrupt says the transaction may have been
    written."""
    if isinstance(e, DBAPIError):
        e.statement = LAST_QUERY_HIDDEN
    else:  # an interrupt (a signal handler's exception)
        e.add_note(MAY_HAVE_COMMITTED)


def sent(e: DBAPIError) -> bool:
    """Whether `e` came once a query carrying a `COMMIT` had left (`hide_or_note` marked it)."""
    return e.statement == LAST_QUERY_HIDDEN


def final(e: DBAPIError) -> bool:
    """Whether the server's error ends the append, not only its numbering by the database: a
    timeout (`lock_timeout`, `statement_timeout`, a cancel), the server short of resources or
    shutting down. Going statement by statement after it would wait for the lock again."""
    state = getattr(e.orig, "sqlstate", None) or ""
    return state in _FINAL_STATES or state[:2] in _FINAL_CLASSES


_FINAL_STATES = frozenset({"55P03", "57014"})
"""lock_not_available (`lock_timeout`), query_canceled (`statement_timeout`, a cancel)."""
_FINAL_CLASSES = frozenset({"08", "53", "57", "58"})
"""Connection exception, insufficient resources (a full disk), operator intervention (a
shutdown), system error (an I/O error)."""
