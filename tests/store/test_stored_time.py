"""An append's `recorded_at` is stored as SQLAlchemy stores a DateTime: on SQLite, text formatted
by `datetime.isoformat` where that is SQLAlchemy's own text (trm_store.driver.bind_processor),
and by SQLAlchemy everywhere it might not be."""

from __future__ import annotations

import sqlite3
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Column, DateTime, MetaData, String, Table
from sqlalchemy.dialects import postgresql, sqlite

from tests.store.helpers import added
from trm_store import open_store
from trm_store.driver import bind_processor
from trm_store.schema import EVENTS

_DIALECT = sqlite.dialect()
_SQLALCHEMY = EVENTS.c.recorded_at.type.dialect_impl(_DIALECT).bind_processor(_DIALECT)
_OURS = bind_processor(EVENTS.c.recorded_at, _DIALECT)

_OFFSETS = st.one_of(
    st.none(),
    st.just(UTC),
    st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m))),
)


class _Pendulum(datetime):
    """A subclass with its own `isoformat`, as some time libraries' datetimes have."""

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return "not SQLAlchemy's text"


def test_the_sqlite_converter_is_not_sqlalchemy_s_own() -> None:
    # Else the tests below compare SQLAlchemy with itself.
    assert _OURS is not None and _OURS.__module__ == "trm_store.driver"


@given(st.datetimes(timezones=_OFFSETS))
def test_any_datetime_gives_sqlalchemy_s_text(value: datetime) -> None:
    assert _OURS is not None and _SQLALCHEMY is not None
    assert _OURS(value) == _SQLALCHEMY(value)


def test_a_date_none_and_a_datetime_subclass_go_to_sqlalchemy() -> None:
    assert _OURS is not None and _SQLALCHEMY is not None
    subclassed = _Pendulum(2026, 12, 7, 1, 2, 3, 4)
    for value in (date(2026, 12, 7), None, subclassed):
        assert _OURS(value) == _SQLALCHEMY(value)
    assert _OURS(subclassed) == "2026-12-07 01:02:03.000004"


def test_a_column_stored_in_another_format_keeps_sqlalchemy_s_converter() -> None:
    table = Table(
        "t",
        MetaData(),
        Column("at", sqlite.DATETIME(storage_format="%(year)04d/%(month)02d/%(day)02d")),
        Column("name", String),
    )
    converter = bind_processor(table.c.at, _DIALECT)
    assert converter is not None
    assert converter(datetime(2026, 12, 7, 1, 2, 3)) == "2026/12/07"
    assert bind_processor(table.c.name, _DIALECT) is None


def test_postgresql_gets_the_datetime_itself() -> None:
    column = Column("at", DateTime(timezone=True))
    assert bind_processor(column, postgresql.dialect()) is None


def test_an_append_stores_sqlalchemy_s_text_and_reads_back_its_time(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with open_store(f"sqlite:///{path}") as store:
        (event,) = store.append("s", [added(1)])
        (read,) = store.read_stream("s")
    with sqlite3.connect(path) as raw:
        (stored,) = raw.execute("SELECT recorded_at FROM events").fetchone()
    assert stored == _SQLALCHEMY(event.recorded_at)
    assert read.recorded_at == event.recorded_at
