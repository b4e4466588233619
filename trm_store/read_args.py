"""The arguments of the log's reads, checked before any query: a typed EventValidationError, never
a driver's OverflowError or UnicodeEncodeError from deep inside a read.

The ranges and the text rule are `trm_store.vocabulary`'s, shared with every other writer and
reader of the log.
"""

from __future__ import annotations

from collections.abc import Collection

from trm_store.errors import EventValidationError
from trm_store.log_filter import MAX_TYPES, LogFilter
from trm_store.vocabulary import INT64_MAX, count_problem, exact_int, exact_text, text_problem

__all__ = [
    "checked_count",
    "checked_filter",
    "checked_limit",
    "checked_stream_id",
    "checked_stream_read",
]


def checked_count(name: str, value: object, minimum: int) -> int:
    """`value` as a position, version or size of at least `minimum` (and at most INT64_MAX)."""
    value = exact_int(value)  # what is checked is what the driver is given
    problem = count_problem(value, minimum)
    if problem is not None:
        raise EventValidationError(f"{name} {problem}")
    assert isinstance(value, int)
    return value


def checked_limit(limit: object) -> int:
    """`limit` (None: no limit) as the row count a LIMIT clause takes."""
    return INT64_MAX if limit is None else checked_count("limit", limit, 1)


def _checked_text(name: str, value: object) -> str:
    value = exact_text(value)  # what is checked is what the driver is given
    problem = text_problem(value)
    if problem is not None:
        raise EventValidationError(f"{name} {problem}")
    assert isinstance(value, str)
    return value


def checked_stream_id(stream_id: object) -> str:
    """A stream id to read: non-empty text both backends can compare."""
    text = _checked_text("stream_id", stream_id)
    if not text:
        raise EventValidationError("stream_id must be a non-empty string")
    return text


def checked_filter(types: object, stream_prefix: object) -> LogFilter | None:
    """The filter of `read_all` / `subscribe`: `types` a non-empty collection of type names (not
    a bare string, whose characters would be read as names), `stream_prefix` text."""
    names: list[str] | None = None
    if types is not None:
        if isinstance(types, str | bytes) or not isinstance(types, Collection):
            raise EventValidationError(
                f"types must be a collection of type names, got {type(types).__name__}"
            )
        # Read once: the names checked are the names filtered on, whatever the collection does.
        names = [_checked_text("each of types", type_) for type_ in types]
        if not names:
            raise EventValidationError("types must name at least one event type")
        if len(distinct := set(names)) > MAX_TYPES:
            raise EventValidationError(
                f"types names {len(distinct)} event types, at most {MAX_TYPES} can be filtered"
                " on: read unfiltered and filter in Python"
            )
    prefix = None if stream_prefix is None else _checked_text("stream_prefix", stream_prefix)
    return LogFilter.of(names, prefix)


def checked_stream_read(from_version: object, backwards: object, limit: object) -> tuple[int, int]:
    """`read_stream`'s (first version in the reading direction, row limit): `from_version`
    None means 1 forwards and the newest backwards."""
    if not isinstance(backwards, bool):
        raise EventValidationError(f"backwards must be a bool, got {backwards!r:.40}")
    if from_version is None:
        version = INT64_MAX if backwards else 1
    else:
        version = checked_count("from_version", from_version, 1)
    return version, checked_limit(limit)
