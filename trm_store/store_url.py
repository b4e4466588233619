"""What a store URL says, read one way: the few query parameters trm honours, every other one
refused by name (`StoreURLError`), never silently ignored; and the SQLite file a URL names,
which must be a regular file (a FIFO would hang the open, a device swallow the writes); and
the URL as shown to people (`shown_url`), every secret in it masked.

SQLite: `mode=ro` (a read-only store), `mode=rw` (the file must exist), `mode=rwc` (the
default: created if missing) and `uri=true` with SQLAlchemy's `sqlite:///file:PATH?...` form.
PostgreSQL: libpq's connection parameters (`sslmode`, `options`, `connect_timeout`, ...), which
psycopg hands to libpq.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, quote_plus, unquote

from sqlalchemy import URL, make_url
from sqlalchemy.exc import ArgumentError

from trm_store.errors import StoreError, StoreURLError

__all__ = [
    "SqliteTarget",
    "check_postgres_query",
    "check_query_text",
    "check_sqlite_file",
    "parse_store_url",
    "shown_url",
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


_MASK = "***"
_PORTS = range(1, 65536)
_DRIVERS = {"sqlite": ("", "pysqlite"), "postgresql": ("psycopg",)}
"""The DBAPI drivers trm opens each database with: another one would be ignored (SQLite) or
fail on import or deep in the first query (PostgreSQL)."""


def _secret(name: str, sqlite: bool) -> bool:
    """A query value never shown: libpq's `password` and `sslpassword` (and anything named like
    a password); on SQLite, any parameter trm does not read (a credential for something else)."""
    return "password" in name.lower() or (sqlite and name not in SQLITE_PARAMETERS)


def shown_url(url: URL) -> str:
    """`url` for messages and `Store.url`, every secret as `***`: the userinfo password and the
    values `_secret` names. Rendered by hand: SQLAlchemy's rendering hides the userinfo
    password only, and would percent-encode a SQLite path's `:`."""
    sqlite = url.get_backend_name() == "sqlite"
    shown = f"{url.drivername}://"
    if url.username is not None or url.password is not None:
        shown += quote(url.username or "", safe=" +")
        shown += "" if url.password is None else f":{_MASK}"
        shown += "@"
    if url.host is not None:
        shown += f"[{url.host}]" if ":" in url.host else url.host
    shown += "" if url.port is None else f":{url.port}"
    if url.database is not None:
        shown += "/" + (url.database if sqlite else quote(url.database, safe=" +/"))
    elif sqlite:
        shown += "/"
    query = "&".join(
        f"{quote_plus(name)}={_MASK if _secret(name, sqlite) else quote_plus(value)}"
        for name in sorted(url.query)
        for value in _values(url, name)
    )
    return shown + (f"?{query}" if query else "")


def _values(url: URL, name: str) -> tuple[str, ...]:
    value = url.query[name]
    return value if isinstance(value, tuple) else (value,)


def parse_store_url(text: str) -> URL:
    """`text` parsed, or StoreURLError: SQLAlchemy raises a bare ValueError for a port that is
    no number; the message never repeats the text (a misparsed password could stand in it)."""
    try:
        url = make_url(text)
    except ArgumentError:
        raise StoreURLError(
            "not a database URL: write sqlite:///PATH or postgresql://USER@HOST/DB"
        ) from None
    except ValueError:
        raise StoreURLError(
            "cannot read the host and port of the store URL: a port is a number, an IPv6 host "
            "stands in [brackets], a '/' in a password is written %2F"
        ) from None
    check_query_text(text, url)
    backend, _, driver = url.drivername.partition("+")
    if backend in _DRIVERS and driver not in _DRIVERS[backend]:
        raise StoreURLError(
            f"trm opens {backend} with {_DRIVERS[backend][-1]} only, not {driver!r}: "
            f"write {backend}://..."
        )
    if url.port is not None and url.port not in _PORTS:
        raise StoreURLError(f"the port must be 1..65535 in {shown_url(url)}")
    return url


def _single(url: URL, name: str) -> str:
    value = url.query[name]
    if isinstance(value, tuple):
        raise StoreURLError(f"query parameter {name!r} is given more than once in {shown_url(url)}")
    return value


def _refuse_control(*texts: str | None) -> None:
    """libpq cuts a value at a NUL (`te%00st` connected to `te`); SQLite's open raises a bare
    ValueError."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for text in texts for c in text or ""):
        raise StoreURLError(
            "a store URL holds no control characters (newline, tab, NUL, ...), "
            "percent-encoded or not"
        )


def check_query_text(text: str, url: URL) -> None:
    """Refuse what SQLAlchemy's parser would drop silently: control characters, written or
    percent-encoded, and a query parameter without a value. A parameter is honoured or
    refused, never lost."""
    query = [part for name in url.query for part in (name, *_values(url, name))]
    _refuse_control(text, url.username, url.password, url.host, url.database, *query)
    # After the password, if any (PostgreSQL): '?' may stand unencoded in a SQLite path only.
    rest = text if url.get_backend_name() == "sqlite" else text.rpartition("@")[2]
    written = [name for name, _value in parse_qsl(rest.partition("?")[2], keep_blank_values=True)]
    dropped = [name for name in written if name not in url.query]
    if dropped:
        raise StoreURLError(f"query parameter {dropped[0]!r} in {shown_url(url)} has no value")


def _uri_path(url: URL, database: str) -> str:
    """The path of a SQLite URI filename (`file:PATH`, `file:///PATH`, `file://localhost/PATH`),
    percent-decoded as SQLite decodes it."""
    rest = database.removeprefix("file:").split("#", 1)[0]
    if rest.startswith("//"):
        authority, _, path = rest[2:].partition("/")
        if authority not in ("", "localhost"):
            raise StoreURLError(
                f"a SQLite URI names no remote host ({authority!r}): {shown_url(url)}"
            )
        rest = "/" + path
    return unquote(rest)


def sqlite_target(url: URL) -> SqliteTarget:
    """The file `url` names, or StoreURLError naming what trm does not honour."""
    if url.username is not None or url.password is not None or url.host or url.port:
        # SQLAlchemy drops the authority: the path after it would be taken as relative.
        raise StoreURLError(
            f"a SQLite URL names a file, not a user, password, host or port: {shown_url(url)} "
            "(write sqlite:///relative/path or sqlite:////absolute/path)"
        )
    unknown = sorted(set(url.query) - SQLITE_PARAMETERS)
    if unknown:
        raise StoreURLError(
            f"query parameter {unknown[0]!r} in {shown_url(url)} is not one trm honours on SQLite "
            "(it takes mode=ro|rw|rwc and uri=true)"
        )
    uri = "uri" in url.query and _FLAGS.get(_single(url, "uri").lower())
    if uri is None:
        raise StoreURLError(f"uri must be true or false in {shown_url(url)}")
    mode = _single(url, "mode") if "mode" in url.query else "rwc"
    database = url.database or ""
    if database.startswith("file:"):
        if not uri:
            raise StoreURLError(
                f"{shown_url(url)} names a SQLite URI (file:...) without uri=true: add it, as "
                "SQLAlchemy documents, or give the plain path"
            )
        database = _uri_path(url, database)
        _refuse_control(database)  # %2500: SQLAlchemy decodes it to %00, SQLite's URI to NUL
    if database in ("", ":memory:") or mode == "memory":
        raise StoreURLError("the SQLite store needs a file path, not an in-memory database")
    if mode not in _SQLITE_MODES:
        raise StoreURLError(f"mode must be ro, rw or rwc in {shown_url(url)}, got {mode!r}")
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
            f"query parameter {unknown[0]!r} in {shown_url(url)} is not a libpq connection "
            "parameter (e.g. sslmode, options, connect_timeout, application_name)"
        )
