"""Helpers every domain module shares: argument checks, strict event models, UTC times, writes."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Connection, Row, Table, and_, bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ClauseElement

from trm_store.domain.errors import DomainInputError
from trm_store.driver import DriverSql, bind_processor, execute_many, fetch_all, padded_in
from trm_store.event_types import validation_problem
from trm_store.vocabulary import INT64_MAX, INT64_MIN, count_problem, id_problem

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = [
    "ID_MAX",
    "Count",
    "DomainModel",
    "Int64",
    "Positive",
    "Real",
    "as_utc",
    "check_fields",
    "check_finite",
    "check_id",
    "check_int",
    "json_default",
    "present",
    "row_by_key",
    "stream_id",
    "update_rows",
    "upsert",
    "validated",
]

ID_MAX = 200
"""Longest id a facade accepts: `kind:{id}` must fit the log's 255-character stream ids (the
vocabulary's ID_MAX less room for the stream kind)."""

M = TypeVar("M", bound=BaseModel)


class DomainModel(BaseModel):
    """Base of every domain event model: no extra fields, no coercion, finite floats only."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


def _unsigned_zero(value: float) -> float:
    return 0.0 if value == 0 else value


Real = Annotated[float, AfterValidator(_unsigned_zero)]
"""A float field of an event model that a projection keeps in a FLOAT column: -0.0 is recorded
as 0.0, because SQLite's REAL columns store a whole float as an integer and so lose the sign
(PostgreSQL keeps it). The event then holds what both backends read back."""

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
"""An int field of an event model that a projection keeps in an integer (BIGINT) column: the
range both backends hold (`trm_store.vocabulary`), refused beyond it with DomainInputError."""
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
"""An Int64 that counts (>= 0)."""
Positive = Annotated[int, Field(ge=1, le=INT64_MAX)]
"""An Int64 >= 1 (a block number, a pool size)."""


def check_id(name: str, value: object) -> str:
    """A non-blank id of at most ID_MAX printable characters, else DomainInputError."""
    problem = id_problem(value, ID_MAX)
    if problem is not None:
        raise DomainInputError(f"{name} {problem}")
    return cast(str, value)  # id_problem accepts strings only


def check_int(name: str, value: object, *, minimum: int) -> int:
    """An int (not a bool) in [minimum, INT64_MAX] (what both backends hold), else
    DomainInputError."""
    problem = count_problem(value, minimum)
    if problem is not None:
        raise DomainInputError(f"{name} {problem}")
    return cast(int, value)  # count_problem accepts ints only


def check_fields(name: str, fields: Mapping[str, Any], reserved: frozenset[str]) -> dict[str, Any]:
    """Free-form fields: string keys that do not shadow `reserved` names (values are checked by
    the event model, which refuses NaN and non-JSON values)."""
    if not reserved.isdisjoint(fields):
        clash = sorted(k for k in fields if k in reserved)
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
        raise DomainInputError(f"{what}: {validation_problem(e)}") from e


def check_finite(name: str, value: object) -> float:
    """A real number (not a bool), finite."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DomainInputError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def as_utc(value: datetime) -> datetime:
    """A datetime read back from either backend as an aware UTC datetime."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def json_default(value: object) -> str:
    """`json.dumps(default=...)` for the read API's values: a datetime as ISO 8601 (the one
    shape of a timestamp in JSON output); anything else is not JSON."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def row_by_key(
    store: Store, projection: str, table: str, column: str, value: str
) -> Row[Any] | None:
    """The row of `projection`'s `table` whose `column` is `value`, or None."""
    with store.query(projection) as (conn, tables):
        t = tables[table]
        return conn.execute(select(t).where(t.c[column] == value)).first()


def upsert(
    conn: Connection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    update: Sequence[str],
    *,
    add: bool = False,
) -> None:
    """Insert `rows` (one executemany), replacing the `update` columns of rows whose `keys`
    exist (`add`: adding the new values to the stored ones instead, for running totals); within
    `rows` the last row per key wins. Every row has the columns of the first."""
    if not rows:
        return
    key_of = itemgetter(*keys)
    last = {key_of(r): r for r in rows}
    upsert = (tuple(update), add)
    statement = _statement(conn.dialect, table, tuple(rows[0]), tuple(keys), upsert)
    execute_many(conn, statement.sql, [statement.bind(r) for r in last.values()])


def present(
    conn: Connection, table: Table, column: str, values: Sequence[Any], **equal: Any
) -> list[Any]:
    """Which of `values` `table` holds in `column`, among its rows whose columns named in
    `equal` hold the values given there. Sent straight to the driver, `_PRESENT_CHUNK` values
    a statement, one statement per padded size (`padded_in`) kept in the table's `info`: a
    projection looks up a batch's keys on every append, where SQLAlchemy building an `IN` of
    them cost ~3 us a key (a run's predictions, `bench/domain_bench.py`)."""
    statements: dict[tuple[object, ...], DriverSql] = table.info.setdefault("trm_present", {})
    found: list[Any] = []
    for k in range(0, len(values), _PRESENT_CHUNK):
        size, params = padded_in(values[k : k + _PRESENT_CHUNK])
        shape = (column, tuple(equal), size)
        statement = statements.get(shape)
        if statement is None:
            looked_up = table.c[column]
            names = [bindparam(f"i{n}", type_=looked_up.type) for n in range(size)]
            where = [table.c[c] == bindparam(f"e_{c}", type_=table.c[c].type) for c in equal]
            statement = statements[shape] = DriverSql(
                select(looked_up).where(looked_up.in_(names), *where)
            )
        params.update({f"e_{c}": v for c, v in equal.items()})
        found += [value for (value,) in fetch_all(conn, statement, params)]
    return found


_PRESENT_CHUNK = 512
"""Values `present` looks up a statement: under every backend's limit on a statement's
parameters (SQLite's oldest: 999)."""


def update_rows(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], keys: Sequence[str]
) -> None:
    """Set the other columns of each row where its `keys` match (one executemany). Every row
    has the columns of the first."""
    if not rows:
        return
    statement = _statement(conn.dialect, table, tuple(rows[0]), tuple(keys), None)
    execute_many(conn, statement.sql, [statement.bind(r) for r in rows])


@dataclass(frozen=True, slots=True)
class _Statement:
    """A projection's write, built once per table, dialect and shape.

    Projections write on every append and for every event of a rebuild, so the SQL is sent
    straight to the driver (`trm_store.driver`), and values go through the column types' own
    bind processors: stored exactly as SQLAlchemy stores them, without its per-row work.
    """

    sql: DriverSql
    processors: tuple[tuple[str, Callable[[Any], Any]], ...]
    """(column, its bind processor) for the columns whose type converts values."""

    def bind(self, row: Mapping[str, Any]) -> Mapping[str, Any]:
        if not self.processors:
            return row
        bound = dict(row)
        for column, process in self.processors:
            bound[column] = process(bound[column])
        return bound


_INSERTS: dict[str, Callable[[Table], Any]] = {
    "sqlite": sqlite.insert,
    "postgresql": postgresql.insert,
}
"""The dialects' INSERT constructs, which know ON CONFLICT (their types differ, their API not)."""


def _statement(
    dialect: Dialect,
    table: Table,
    columns: tuple[str, ...],
    keys: tuple[str, ...],
    upsert: tuple[tuple[str, ...], bool] | None,
) -> _Statement:
    """The upsert of `columns` replacing (or, flagged, adding to) the columns of `upsert` on a
    conflict of `keys` (or, for None, the update of the other columns where `keys` match),
    built by SQLAlchemy and kept in the table's `info`: a scratch table's statements go with
    it. Kept per driver, not per engine: every engine of a store serialises JSON with
    `serialize_json`."""
    cache: dict[tuple[object, ...], _Statement] = table.info.setdefault("trm_statements", {})
    shape = (dialect.name, dialect.driver, dialect.paramstyle, columns, keys, upsert)
    found = cache.get(shape)
    if found is not None:
        return found
    values: dict[str, Any] = {
        c: bindparam(c) for c in columns if upsert is not None or c not in keys
    }
    statement: ClauseElement
    if upsert is None:
        where = and_(*(table.c[k] == bindparam(k) for k in keys))
        statement = update(table).where(where).values(values)
    else:
        replaced, add = upsert
        insert = _INSERTS[dialect.name](table).values(values)
        new = insert.excluded
        statement = insert.on_conflict_do_update(
            index_elements=[table.c[k] for k in keys],
            set_={c: table.c[c] + new[c] if add else new[c] for c in replaced},
        )
    processors = tuple(
        (c, process) for c in columns if (process := bind_processor(table.c[c], dialect))
    )
    found = cache[shape] = _Statement(DriverSql(statement), processors)
    return found
