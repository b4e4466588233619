"""Canaries: the private interpreter, SQLAlchemy and pydantic internals the store's fast paths rely
on, each checked for exactly what the code assumes. When an upgrade changes one, its canary fails
and names what changed and the code that relies on it; nothing else may be the first to notice.

| internal                                               | relied on by                          |
|--------------------------------------------------------|---------------------------------------|
| `Connection._has_events`, `Engine._has_events`         | `driver.send`: skips listener lookup  |
| `dispatch.before_cursor_execute` wrapping listeners    | `driver.send`: calls them itself      |
| `SQLCompiler.positional` / `.positiontup`, `.binds`    | `DriverSql.compiled`                  |
| `DBAPIError.instance`                                  | `driver.send`: SQLAlchemy's types     |
| `json.encoder.c_make_encoder` (its arguments)          | `json_codec._c_encoder`               |
| `json.encoder.encode_basestring_ascii`                 | `json_codec.dumps_json`               |
| `json.scanner.make_scanner` (C, StopIteration)         | `json_codec.loads_json`               |
| `__class__` assignment: a twin of `RecordedEvent`      | `events.recorded_event`               |
| `NewEvent`'s slot descriptors, no `__post_init__`      | `events.NewEvent.__init__`            |
| `__pydantic_validator__`, `__pydantic_serializer__`    | `event_types.EventType.validate`      |
| `sqlite3.Error.sqlite_errorcode`                       | `sqlite.SqliteBackend.translate`      |
| `SQLiteDialect_pysqlite.do_begin`                      | `sqlite_dialect`: a `BEGIN` each time |
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import json.encoder
import json.scanner
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql.compiler import SQLCompiler

from trm_store import json_codec, open_store
from trm_store.events import NewEvent, RecordedEvent, recorded_event
from trm_store.sqlite_dialect import TransactionalSqliteDialect, register_dialect


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    register_dialect()
    engine = create_engine(f"sqlite+trm:///{tmp_path / 'canary.db'}")
    yield engine
    engine.dispose()


def test_has_events_flags(engine: Engine, tmp_path: Path) -> None:
    why = "SQLAlchemy's private `_has_events` flags changed: trm_store.driver.send tests them"
    with engine.connect() as conn:
        assert conn._has_events is False and engine._has_events is False, why
    with open_store(f"sqlite:///{tmp_path / 'store.db'}", projections={}) as store:
        assert store._backend.engine._has_events is False, (  # its pool listener is no engine's
            "a store's SQLite engine has connection event checks on: every append pays for them"
        )
    event.listen(engine, "before_cursor_execute", lambda *a: None)
    with engine.connect() as conn:
        assert engine._has_events is True, why
    with create_engine("sqlite://").connect() as other:
        event.listen(other, "before_cursor_execute", lambda *a: None)
        assert other._has_events is True, why


def test_dispatch_wraps_listeners_to_return_statement_and_parameters(engine: Engine) -> None:
    event.listen(engine, "before_cursor_execute", lambda *a: None)  # returns None itself
    with engine.connect() as conn:
        listeners = list(conn.dispatch.before_cursor_execute)
        assert len(listeners) == 1
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        returned = listeners[0](conn, cursor, "SELECT ?", (1,), None, False)
        cursor.close()
    assert returned == ("SELECT ?", (1,)), (
        "SQLAlchemy no longer wraps a before_cursor_execute listener to return "
        "(statement, parameters): trm_store.driver.send unpacks what each one returns"
    )


def test_compiled_positions_and_binds(engine: Engine) -> None:
    compiled = text("SELECT :b, :a, :b").compile(dialect=engine.dialect)
    assert isinstance(compiled, SQLCompiler)
    why = "SQLCompiler.positional/positiontup changed: trm_store.driver.DriverSql binds by them"
    assert compiled.positional is True, why
    assert list(compiled.positiontup or ()) == ["b", "a", "b"], why
    assert set(compiled.binds) == {"a", "b"}, "Compiled.binds changed: DriverSql's literals use it"


def test_dbapi_error_instance_wraps_in_sqlalchemy_s_type(engine: Engine) -> None:
    original = sqlite3.IntegrityError("UNIQUE constraint failed: t.k")
    wrapped = DBAPIError.instance("INSERT", (), original, sqlite3.Error, dialect=engine.dialect)
    assert isinstance(wrapped, IntegrityError) and wrapped.orig is original, (
        "DBAPIError.instance changed: trm_store.driver.send wraps driver errors with it"
    )


def test_the_c_json_encoder_is_in_use() -> None:
    why = (
        "json.encoder.c_make_encoder is gone or takes other arguments: the canonical codec fell "
        "back to the public encoder (same text, slower appends); see json_codec._c_encoder"
    )
    assert json.encoder.c_make_encoder is not None, why
    assert json_codec._encode != json_codec._CANONICAL.encode, why


def test_encode_basestring_ascii_writes_what_json_dumps_writes() -> None:
    for value in ["", "plain", 'q"\\', "é\u2028\x00\x1f", "\ud83d\ude00", "\ud800"]:
        assert json.encoder.encode_basestring_ascii(value) == json.dumps(value), (
            "json.encoder.encode_basestring_ascii changed: json_codec.dumps_json writes bare "
            "strings with it"
        )


def test_the_c_json_scanner_and_its_stop_iteration() -> None:
    why = "json.scanner.make_scanner changed: json_codec.loads_json calls it directly"
    assert json.scanner.c_make_scanner is not None, why  # type: ignore[attr-defined]
    scan: Any = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
    assert type(scan).__module__ == "_json", why
    assert scan('{"a":[1,2.5,null]} ', 0) == ({"a": [1, 2.5, None]}, 18), why
    with pytest.raises(StopIteration):
        scan("nope", 0)


def test_recorded_event_s_fields_are_its_whole_init() -> None:
    """`recorded_event` builds a twin of RecordedEvent's fields and assigns `__class__`: the
    fields must be all its `__init__` does, and the result a RecordedEvent like any other."""
    fields = dataclasses.fields(RecordedEvent)
    names = [f.name for f in fields]
    assert list(RecordedEvent.__slots__) == names, (
        "RecordedEvent's __slots__ are no longer its fields in order: recorded_event's twin "
        "(its fields as slots) may no longer have its layout"
    )
    assert not hasattr(RecordedEvent, "__post_init__"), (
        "RecordedEvent has a __post_init__: recorded_event bypasses __init__ and would skip it"
    )
    # Its __init__ the one dataclasses writes (compiled from text: "<string>"), not one of its
    # own, and no __new__: recorded_event calls neither (review, eighteenth session).
    assert RecordedEvent.__init__.__code__.co_filename == "<string>", (
        "RecordedEvent.__init__ is no longer the one dataclasses generates: recorded_event "
        "bypasses it and would skip what it does"
    )
    assert RecordedEvent.__new__ is object.__new__, (
        "RecordedEvent has a __new__ of its own: recorded_event bypasses it"
    )
    missing = dataclasses.MISSING
    assert all(f.default is missing and f.default_factory is missing for f in fields), (
        "a RecordedEvent field has a default: recorded_event always sets every field"
    )
    at = datetime.now(UTC)
    values = (1, "e", "s", 1, "t", 1, {"d": 1}, {"m": 2}, at)
    built = recorded_event(*values)
    assert type(built) is RecordedEvent
    assert built == RecordedEvent(*values)
    assert [getattr(built, name) for name in names] == list(values)
    assert repr(built) == repr(RecordedEvent(*values))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.position = 2  # type: ignore[misc]


def test_pydantic_s_validator_and_serializer_are_what_validate_and_dump_use() -> None:
    class Model(BaseModel):
        n: int
        at: datetime

    data = {"n": 1, "at": "2026-01-01T00:00:00Z"}
    why = "pydantic's __pydantic_validator__/__pydantic_serializer__ changed: EventType.validate"
    instance = Model.__pydantic_validator__.validate_python(data)
    assert instance == Model.model_validate(data), why
    dumped = Model.__pydantic_serializer__.to_python(instance, mode="json")
    assert dumped == instance.model_dump(mode="json"), why


def test_sqlite_errors_carry_their_result_code(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "codes.db")
    try:
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(sqlite3.IntegrityError) as info:
            conn.execute("INSERT INTO t VALUES (1)")
    finally:
        conn.close()
    assert info.value.sqlite_errorcode == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, (
        "sqlite3 errors no longer carry sqlite_errorcode: SqliteBackend.translate reads it"
    )


def test_the_dialect_s_do_begin_runs_for_each_transaction(engine: Engine) -> None:
    assert isinstance(engine.dialect, TransactionalSqliteDialect)
    assert issubclass(TransactionalSqliteDialect, SQLiteDialect_pysqlite)
    with engine.connect() as conn, conn.begin():
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None
        assert dbapi_connection.in_transaction, (  # type: ignore[attr-defined]
            "SQLAlchemy no longer calls the dialect's do_begin when a transaction begins: "
            "sqlite+trm reads would see no snapshot"
        )


def test_new_event_s_init_sets_its_slots_as_the_generated_one_would() -> None:
    """`NewEvent.__init__` is written by hand (through its slots' descriptors, for speed): it
    must take the fields, in order, with their defaults, and set each of them."""
    fields = dataclasses.fields(NewEvent)
    assert list(NewEvent.__slots__) == [f.name for f in fields], (
        "NewEvent's __slots__ are no longer its fields in order: its __init__ sets them through "
        "their descriptors, in that order"
    )
    assert not hasattr(NewEvent, "__post_init__"), "NewEvent.__init__ would not call it"
    parameters = list(inspect.signature(NewEvent).parameters.values())
    empty = inspect.Parameter.empty
    assert not any(f.kw_only for f in fields), "a keyword-only field: NewEvent.__init__ has none"
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert [(p.name, p.default, p.kind) for p in parameters] == [
        (f.name, empty if f.default is dataclasses.MISSING else f.default, positional)
        for f in fields
    ], "NewEvent.__init__'s parameters are no longer its fields, in order, with their defaults"
    values = ("t", {"d": 1}, {"m": 2}, "e")
    event = NewEvent(*values)
    assert dataclasses.astuple(event) == values
    assert dataclasses.replace(event, meta=None) == NewEvent("t", {"d": 1}, None, "e")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.type = "u"  # type: ignore[misc]
