"""`open_store`, the one bootstrap: register trm's domain types, build the backend, verify (or
create) the schema and, on a writable open, bring every projection up to date.

The domain's event types and projections are registered here, by `trm_store.domain.load()` (its
modules, discovered), and nowhere else: the facade (`trm_store.store`) knows no domain.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.exc import SQLAlchemyError

from trm_store import domain
from trm_store.backend import Durability, store_error
from trm_store.connect import create_backend, default_url
from trm_store.migrate import ensure_schema
from trm_store.projections import Projection, keyed_by_name, registered_projections
from trm_store.store import Store

__all__ = ["open_store"]


def open_store(
    url: str | None = None,
    *,
    read_only: bool = False,
    auto_upgrade: bool = False,
    durability: Durability = "normal",
    projections: Mapping[str, Projection] | None = None,
    adopt_database: bool = False,
) -> Store:
    """Open (creating at the head migration if new) the store at `url`.

    url defaults to TRM_STORE_URL, then sqlite:///trm.db. A database at an older migration raises
    SchemaVersionError naming `alembic upgrade head` unless auto_upgrade=True. read_only=True never
    writes (SQLite `mode=ro`, PostgreSQL read-only transactions); so does a SQLite URL with
    `mode=ro`. A database that is not a trm store but holds tables of its own raises
    ForeignDatabaseError unless adopt_database=True, which adds trm's tables beside them.
    `projections` defaults to every registered projection (trm's domain read models and any the
    caller registered); a mapping given holds each projection under its own `name` (StoreError
    otherwise, before the database is touched).
    """
    domain.load()
    chosen = registered_projections() if projections is None else keyed_by_name(projections)
    backend = create_backend(default_url(url), read_only=read_only, durability=durability)
    store = Store(backend, chosen)
    try:
        if backend.read_only:  # asked for, or said by the URL (mode=ro)
            with backend.read_transaction() as conn:
                ensure_schema(conn, auto_upgrade=False, writable=False, adopt=False)
        else:
            with backend.write_transaction() as conn:
                ensure_schema(conn, auto_upgrade=auto_upgrade, writable=True, adopt=adopt_database)
            if adopt_database:
                backend.close()  # new connections see a trm store (SQLite: and switch to WAL)
            store.recover()
    except SQLAlchemyError as e:
        store.close()
        raise store_error(backend, e) from e
    except BaseException:
        store.close()
        raise
    return store
