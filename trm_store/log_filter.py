"""Which events a filtered read of the log wants (`LogFilter`), as SQL an index serves.

Only matching rows are read: each type is its own range of the `(type, position)` index, read in
position order and merged by the database (one `UNION ALL` branch per type, each bounded by the
batch's LIMIT, so a batch reads at most `len(types) * limit` index entries). Past `MERGED_TYPES`
types that statement costs more to plan than to run (1,000 types: 1.2 s a read on PostgreSQL,
10,000: its stack depth exceeded), so the types go as one `IN` list, padded to a power of two
(`padded_in`: a few statements serve every count), which the database serves as it chooses;
past `MAX_TYPES` a filter is refused (`read_args`). With types, the position range bounds each
type's index range (a stream prefix is then a filter on what that range gives).

A stream prefix alone is a range of the `(stream_id, stream_version)` index, sorted by position:
a batch costs the prefix's index entries, all of them, wherever the cursor is. Unless the log
after the cursor is no longer than a batch (positions are dense, so that is `until - after`):
the log is then read in position order from the cursor, the prefix a filter, so a follower at
the head (a subscription's wake-up) reads what was appended since, not the prefix's history.
Prefixes are ranges, not `LIKE`: `%`, `_` and
`\\` are ordinary characters of a stream id, and a range is served by a plain index on both
backends (stream ids compare by code point: SQLite's BINARY collation, PostgreSQL's "C").
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from functools import cache
from typing import Any

from trm_store.driver import DriverSql, padded_in

__all__ = ["MAX_TYPES", "MERGED_TYPES", "LogFilter", "prefix_bounds"]

MERGED_TYPES = 16
"""Up to how many types a filtered read merges one index range per type."""
MAX_TYPES = 512
"""The most types a filter may name: an `IN` list of at most 512 parameters (SQLite before 3.32
takes 999 in one statement, and the next power of two would be 1,024)."""

_MAX_CHAR = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


def prefix_bounds(prefix: str) -> tuple[str, str | None]:
    """The range [low, high) of the strings that start with `prefix` (high None: no end).

    In code point order, the strings starting with `prefix` are exactly those >= prefix and <
    prefix with its last character incremented; a last character that cannot be incremented
    (U+10FFFF) is dropped and the one before it incremented. Surrogates are skipped: no valid
    stream id holds one.
    """
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < _MAX_CHAR:
            following = last + 1
            if following in _SURROGATES:
                following = _SURROGATES.stop
            return prefix, "".join(chars) + chr(following)
    return prefix, None


@dataclass(frozen=True, slots=True)
class LogFilter:
    """Events of one of `types` (None: any type) whose stream id starts with `prefix` (None:
    any stream)."""

    types: tuple[str, ...] | None = None
    prefix: str | None = None

    @classmethod
    def of(cls, types: Collection[str] | None, prefix: str | None) -> LogFilter | None:
        """The filter for validated `read_all` arguments; None when nothing is filtered."""
        if types is None and not prefix:
            return None
        return cls(None if types is None else tuple(sorted(set(types))), prefix or None)

    def statement(self, select: str, span: int, limit: int) -> DriverSql:
        """`select` (every column of the events table) restricted to this filter, in position
        order, with parameters :after, :until, :limit (and :t0.., :low, :high); `span`: how
        many events of the log lie in (after, until]."""
        low_high = None if self.prefix is None else prefix_bounds(self.prefix)[1] is not None
        types = None if self.types is None else self._type_params()[0]
        return _statement(select, types, low_high, types is None and span <= limit)

    def _type_params(self) -> tuple[int, dict[str, Any]]:
        """How many type parameters the statement has (past `MERGED_TYPES`, a power of two: the
        last type repeated), and their values, :t0.."""
        types = self.types or ()
        if len(types) <= MERGED_TYPES:
            return len(types), {f"t{i}": type_ for i, type_ in enumerate(types)}
        return padded_in(types, "t")

    def params(self, after: int, until: int, limit: int) -> dict[str, Any]:
        """The statement's parameters for positions in (after, until], at most `limit` rows."""
        params: dict[str, Any] = {"after": after, "until": until, "limit": limit}
        params.update(self._type_params()[1])
        if self.prefix is not None:
            params["low"], high = prefix_bounds(self.prefix)
            if high is not None:
                params["high"] = high
        return params


@cache
def _statement(
    select: str, type_count: int | None, bounded_prefix: bool | None, by_position: bool
) -> DriverSql:
    """Built once per shape (how many types, which prefix bounds, a prefix read in position
    order or by its index)."""
    where = "position > :after AND position <= :until"
    if bounded_prefix is not None:
        # `|| ''`: no term for the stream index, so the log is read from the cursor; `+position`:
        # none for the primary key, or SQLite's planner scans the whole log in position order
        # (to skip the sort) instead of the prefix's range of stream ids. With types, the
        # position bounds each type's range of its index.
        stream = "stream_id || ''" if by_position else "stream_id"
        prefix = f"{stream} >= :low" + (f" AND {stream} < :high" if bounded_prefix else "")
        if not (by_position or type_count is not None):
            where = "+position > :after AND +position <= :until"
        where = f"{prefix} AND {where}"
    order = "ORDER BY position LIMIT :limit"
    if type_count is None:
        return DriverSql(f"{select} WHERE {where} {order}")
    if type_count == 1:
        return DriverSql(f"{select} WHERE type = :t0 AND {where} {order}")
    if type_count > MERGED_TYPES:
        listed = ", ".join(f":t{i}" for i in range(type_count))
        return DriverSql(f"{select} WHERE type IN ({listed}) AND {where} {order}")
    columns = select.removeprefix("SELECT ").split(" FROM ")[0]
    branches = [
        f"SELECT {columns} FROM ({select} WHERE type = :t{i} AND {where} {order}) AS b{i}"
        for i in range(type_count)
    ]
    return DriverSql(f"{' UNION ALL '.join(branches)} {order}")
