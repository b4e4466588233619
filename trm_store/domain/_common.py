"""Helpers every domain module shares: argument checks, strict event models, UTC times, upserts."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy import Connection, Table
from sqlalchemy.dialects import postgresql, sqlite

from trm_store.domain.errors import DomainInputError

__all__ = [
    "ID_MAX",
    "DomainModel",
    "as_utc",
    "check_fields",
    "check_finite",
    "check_id",
    "check_int",
    "stream_id",
    "upsert",
    "validated",
]

ID_MAX = 200
"""Longest id a facade accepts: `kind:{id}` must fit the log's 255-character stream ids."""

M = TypeVar("M", bound=BaseModel)


class DomainModel(BaseModel):
    """Base of every domain event model: no extra fields, no coercion, finite floats only."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


def check_id(name: str, value: object) -> str:
    """A non-blank id of at most ID_MAX printable characters, else DomainInputError."""
    if not isinstance(value, str):
        raise DomainInputError(f"{name} must be a string, got {type(value).__name__}")
    if not value.strip() or len(value) > ID_MAX:
        raise DomainInputError(f"{name} must be a non-blank string of at most {ID_MAX} characters")
    if not value.isprintable():
        raise DomainInputError(f"{name} {value!r} contains control characters")
    return value


def check_int(name: str, value: object, *, minimum: int) -> int:
    """An int (not a bool) >= minimum, else DomainInputError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DomainInputError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_fields(name: str, fields: Mapping[str, Any], reserved: frozenset[str]) -> dict[str, Any]:
    """Free-form fields: string keys that do not shadow `reserved` names (values are checked by
    the event model, which refuses NaN and non-JSON values)."""
    clash = sorted(k for k in fields if k in reserved)
    if clash:
        raise DomainInputError(f"{name}: {clash} are reserved and cannot be set this way")
    for key in fields:
        check_id(f"{name} key", key)
    return dict(fields)


def stream_id(kind: str, entity_id: str) -> str:
    """The stream of one entity, e.g. `run:r1`."""
    return f"{kind}:{entity_id}"


def validated(model: type[M], data: Mapping[str, Any], what: str) -> M:
    """`data` as a `model` instance; a validation failure is a DomainInputError naming `what`."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise DomainInputError(f"{what}: {e}") from e


def check_finite(name: str, value: object) -> float:
    """A real number (not a bool), finite."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DomainInputError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def as_utc(value: datetime) -> datetime:
    """A datetime read back from either backend as an aware UTC datetime."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def upsert(
    conn: Connection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    update: Sequence[str],
) -> None:
    """Insert `rows` (one executemany), replacing the `update` columns of rows whose `keys`
    exist; within `rows` the last row per key wins."""
    if not rows:
        return
    last = {tuple(r[k] for k in keys): r for r in rows}
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table)
    stmt = stmt.on_conflict_do_update(
        index_elements=list(keys), set_={c: stmt.excluded[c] for c in update}
    )
    conn.execute(stmt, list(last.values()))
