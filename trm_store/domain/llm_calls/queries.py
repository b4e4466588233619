"""The LLM calls' rows as the `llm_calls` projection holds them: calls, breaker changes, limit
changes, cache problems, each in log order, optionally of one source and after a position."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from trm_store.domain._common import as_utc, check_id, check_int, row_by_key
from trm_store.domain.errors import UnknownCallError
from trm_store.domain.llm_calls.projection import PROJECTION

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["breaker_transitions", "cache_problems", "limit_changes", "llm_call", "llm_calls"]


def _rows(store: Store, table: str, source: str | None, after: int) -> list[dict[str, Any]]:
    check_int("after", after, minimum=0)
    with store.query(PROJECTION) as (conn, tables):
        t = tables[table]
        query = select(t).where(t.c.position > after).order_by(t.c.position)
        if source is not None:
            query = query.where(t.c.source == check_id("source", source))
        rows = [dict(r._mapping) for r in conn.execute(query)]
    for row in rows:
        row["recorded_at"] = as_utc(row["recorded_at"])
    return rows


def llm_calls(store: Store, *, source: str | None = None, after: int = 0) -> list[dict[str, Any]]:
    """Every recorded call (of one source, if given; whose event sits after position `after`)
    in the order they ended."""
    return _rows(store, "calls", source, after)


def llm_call(store: Store, call_id: str) -> dict[str, Any]:
    """One call's row; `UnknownCallError` if it was never recorded."""
    row = row_by_key(store, PROJECTION, "calls", "call_id", check_id("call_id", call_id))
    if row is None:
        raise UnknownCallError(f"no LLM call {call_id!r} was recorded")
    return {**row._mapping, "recorded_at": as_utc(row.recorded_at)}


def breaker_transitions(
    store: Store, *, source: str | None = None, after: int = 0
) -> list[dict[str, Any]]:
    """Breaker state changes (of one source, if given; after position `after`) in order."""
    return _rows(store, "breaker", source, after)


def limit_changes(
    store: Store, *, source: str | None = None, after: int = 0
) -> list[dict[str, Any]]:
    """Concurrency limit changes (of one source, if given; after position `after`) in order."""
    return _rows(store, "limits", source, after)


def cache_problems(store: Store) -> list[dict[str, Any]]:
    """Corrupt cache entries and failed cache reads and writes, in order."""
    return _rows(store, "cache", None, 0)
