"""A store is made only in a SQLite file whose text is UTF-8 (`trm_store.migrate`): SQLite
compares text as bytes in the file's encoding, and in a UTF-16 file a stream-prefix read of "a"
returned the stream "\u0161x" (bytes 61 01) and missed "a\U0001f600"."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.store.helpers import TOTALS, added
from trm_store import ForeignDatabaseError, open_store


def _file_in(path: Path, encoding: str, *, foreign_table: bool) -> str:
    """An empty file (or one holding a table of its own) whose text is `encoding`."""
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA encoding = '{encoding}'")
    conn.execute("CREATE TABLE theirs (x)")
    if not foreign_table:
        conn.execute("DROP TABLE theirs")
    conn.commit()
    conn.close()
    return f"sqlite:///{path}"


def _tables(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    finally:
        conn.close()


@pytest.mark.parametrize("encoding", ["UTF-16le", "UTF-16be"])
@pytest.mark.parametrize("foreign_table", [False, True])
def test_no_store_is_made_in_a_file_whose_text_is_not_utf8(
    tmp_path: Path, encoding: str, foreign_table: bool
) -> None:
    path = tmp_path / "other.db"
    url = _file_in(path, encoding, foreign_table=foreign_table)
    before = _tables(path)
    with pytest.raises(ForeignDatabaseError, match=encoding):
        open_store(url, projections=TOTALS, adopt_database=True)
    assert _tables(path) == before


def test_a_utf8_file_set_so_explicitly_gets_its_store(tmp_path: Path) -> None:
    url = _file_in(tmp_path / "utf8.db", "UTF-8", foreign_table=False)
    with open_store(url, projections=TOTALS) as store:
        for stream in ["a1", "\u0161x", "a\U0001f600", "b"]:
            store.append(stream, [added(1)])
        assert [e.stream_id for e in store.read_all(stream_prefix="a")] == ["a1", "a\U0001f600"]
