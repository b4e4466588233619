"""What a store URL says, read one way: the few query parameters trm honours, every other one
refused by name (`StoreURLError`), never silently ignored; and the SQLite file a URL names,
which must be a regular file (a FIFO would hang the open, a device swallow the writes).

SQLite: `mode=ro` (a read-only store), `mode=rw` (the file must exist), `mode=rwc` (the
default: created if missing) and `uri=true` with SQLAlchemy's `sqlite:///file:PATH?...` form.
PostgreSQL: libpq's connection parameters (`sslmode`, `options`, `connect_timeout`, ...), which
psycopg hands to libpq.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote

from sqlalchemy import URL

from trm_store.errors import StoreError, StoreURLError

__all__ = [
    "SqliteTarget",
    "check_postgres_query",
    "check_query_text",
    "check_sqlite_file",
    "sqlite_target",
]

_SQLITE_MODES = {"ro", "rw", "rwc"}
_FLAGS = {"true": True, "1": True, "yes": True, "on": True}
_FLAGS.update({"false": False, "0": False, "no": False, "off": False})
_COMPANIONS = ("", "-wal", "-shm", "-journal")
"""The database file and the files SQLite opens beside it."""


@dataclass(frozen=True)
class SqliteTarget:
    """The file a SQLite URL names and how it asks to open it."""

    path: Path
    read_only: bool  # mode=ro
    must_exist: bool  # mode=ro or mode=rw


SQLITE_PARAMETERS = frozenset({"mode", "uri"})
"""The query parameters trm reads from a SQLite URL."""


def _shown(url: URL) -> str:
    """The URL as the user wrote it (SQLAlchemy's rendering would percent-encode a SQLite
    path's `:`), never its password, nor the value of a query parameter trm does not read
    (it may be a credential meant for something else)."""
    if url.get_backend_name() != "sqlite":
        return url.render_as_string(hide_password=True)
    query = "&".join(
        f"{name}={value if name in SQLITE_PARAMETERS else '***'}"
        for name, values in url.query.items()
        for value in (values if isinstance(values, tuple) else (values,))
    )
    return f"{url.drivername}:///{url.database or ''}" + (f"?{query}" if query else "")


def _single(url: URL, name: str) -> str:
    value = url.query[name]
    if isinstance(value, tuple):
        raise StoreURLError(f"query parameter {name!r} is given more than once in {_shown(url)}")
    return value


def check_query_text(text: str, url: URL) -> None:
    """Refuse what SQLAlchemy's parser would drop silently: control characters, and a query
    parameter without a value. A parameter is honoured or refused, never lost."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise StoreURLError("a store URL holds no control characters (newline, tab, NUL, ...)")
    # After the password, if any (PostgreSQL): '?' may stand unencoded in a SQLite path only.
    rest = text if url.get_backend_name() == "sqlite" else text.rpartition("@")[2]
    written = [name for name, _value in parse_qsl(rest.partition("?")[2], keep_blank_values=True)]
    dropped = [name for name in written if name not in url.query]
    if dropped:
        raise StoreURLError(f"query parameter {dropped[0]!r} in {_shown(url)} has no value")


def _uri_path(url: URL, database: str) -> str:
    """The path of a SQLite URI filename (`file:PATH`, `file:///PATH`, `file://localhost/PATH`),
    percent-decoded as SQLite decodes it."""
    rest = database.removeprefix("file:").split("#", 1)[0]
    if rest.startswith("//"):
        authority, _, path = rest[2:].partition("/")
        if authority not in ("", "localhost"):
            raise StoreURLError(f"a SQLite URI names no remote host ({authority!r}): {_shown(url)}")
        rest = "/" + path
    return unquote(rest)


def sqlite_target(url: URL) -> SqliteTarget:
    """The file `url` names, or StoreURLError naming what trm does not honour."""
    unknown = sorted(set(url.query) - SQLITE_PARAMETERS)
    if unknown:
        raise StoreURLError(
            f"query parameter {unknown[0]!r} in {_shown(url)} is not one trm honours on SQLite "
            "(it takes mode=ro|rw|rwc and uri=true)"
        )
    uri = "uri" in url.query and _FLAGS.get(_single(url, "uri").lower())
    if uri is None:
        raise StoreURLError(f"uri must be true or false in {_shown(url)}")
    mode = _single(url, "mode") if "mode" in url.query else "rwc"
    database = url.database or ""
    if database.startswith("file:"):
        if not uri:
            raise StoreURLError(
                f"{_shown(url)} names a SQLite URI (file:...) without uri=true: add it, as "
                "SQLAlchemy documents, or give the plain path"
            )
        database = _uri_path(url, database)
    if database in ("", ":memory:") or mode == "memory":
        raise StoreURLError("the SQLite store needs a file path, not an in-memory database")
    if mode not in _SQLITE_MODES:
        raise StoreURLError(f"mode must be ro, rw or rwc in {_shown(url)}, got {mode!r}")
    return SqliteTarget(
        Path(database).expanduser().resolve(),
        read_only=mode == "ro",
        must_exist=mode in ("ro", "rw"),
    )


def check_sqlite_file(path: Path, *, create: bool) -> None:
    """Refuse, at once, a path (or a file beside it) that is no regular file; create the
    parent directory when `create`, else refuse a missing file."""
    for companion in _COMPANIONS:
        name = Path(f"{path}{companion}")
        try:
            mode = name.stat().st_mode
        except FileNotFoundError:
            continue
        except OSError as e:
            raise StoreURLError(f"cannot use {name} as a SQLite file: {e.strerror}") from e
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, socket or device"
            raise StoreURLError(f"{name} is {kind}, not a SQLite file")
    if path.exists():
        return
    if not create:
        raise StoreError(f"no SQLite store at {path}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreURLError(f"cannot create the directory of {path}: {e.strerror}") from e


def check_postgres_query(url: URL) -> None:
    """Refuse a query parameter libpq does not know, by name, before connecting."""
    from psycopg.pq import Conninfo

    known = {option.keyword.decode() for option in Conninfo.get_defaults()}
    unknown = sorted(set(url.query) - known)
    if unknown:
        raise StoreURLError(
            f"query parameter {unknown[0]!r} in {_shown(url)} is not a libpq connection "
            "parameter (e.g. sslmode, options, connect_timeout, application_name)"
        )
