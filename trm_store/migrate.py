"""Schema versioning: find the migrations (repo or wheel), create new databases, refuse old ones."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect

from trm_store.errors import ForeignDatabaseError, SchemaVersionError

__all__ = ["alembic_config", "ensure_schema", "head_revision"]

UPGRADE_HINT = (
    "run `alembic upgrade head` from the trm checkout with TRM_STORE_URL set to this database"
)


def migrations_dir() -> Path:
    """The migrations shipped in the wheel, else the repository's `migrations/`."""
    shipped = Path(str(resources.files("trm_store").joinpath("_migrations")))
    if (shipped / "env.py").is_file():
        return shipped
    return Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    """An alembic Config pointing at our migrations, optionally bound to `connection`."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The single head revision of our migrations."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "trm ships at least one migration"
    return head


def _known_revisions() -> set[str]:
    script = ScriptDirectory.from_config(alembic_config())
    return {revision.revision for revision in script.walk_revisions()}


def _foreign_tables(connection: Connection) -> list[str]:
    """Tables and views of a database trm never created (it has no trm schema version)."""
    inspector = inspect(connection)
    return sorted([*inspector.get_table_names(), *inspector.get_view_names()])


def _refuse_other_encodings(connection: Connection) -> None:
    """A store is made only in a SQLite file whose text is UTF-8: SQLite compares text as its
    bytes in the file's encoding, and only UTF-8's order is code-point order, which a
    stream-prefix read's index range relies on (UTF-16 put "\u0161x" among the streams of "a")."""
    if connection.dialect.name != "sqlite":
        return
    encoding = connection.exec_driver_sql("PRAGMA encoding").scalar_one()
    if encoding != "UTF-8":
        raise ForeignDatabaseError(
            f"the database's text encoding is {encoding}; a trm store needs UTF-8 (SQLite "
            "cannot change it once set): nothing was added. Give a new file"
        )


def ensure_schema(
    connection: Connection, *, auto_upgrade: bool, writable: bool, adopt: bool
) -> None:
    """Create a new database at head; upgrade or refuse one at an older revision; refuse to add
    trm's tables to a database holding others unless `adopt`.

    Runs inside the caller's write transaction, so two processes opening a new database at once
    cannot both create it.
    """
    current = MigrationContext.configure(connection).get_current_revision()
    head = head_revision()
    if current == head:
        return
    if current is not None and current not in _known_revisions():
        raise SchemaVersionError(
            f"database is at revision {current}, newer than this trm knows (head {head}): "
            "upgrade trm instead of the database"
        )
    is_new = current is None and not inspect(connection).has_table("events")
    if current is None and not is_new:
        raise SchemaVersionError(f"database has trm tables but no schema version; {UPGRADE_HINT}")
    foreign = _foreign_tables(connection) if is_new and not adopt else []
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise ForeignDatabaseError(
            f"the database is not a trm store: it holds tables of its own ({shown}); nothing "
            "was added. Open it writable with open_store(..., adopt_database=True) to add "
            "trm's tables beside them, or give another database"
        )
    if is_new and writable:
        _refuse_other_encodings(connection)
    if not writable:
        state = "is empty" if is_new else f"is at revision {current}, this trm expects {head}"
        raise SchemaVersionError(f"read-only store {state}; {UPGRADE_HINT}")
    if not (is_new or auto_upgrade):
        raise SchemaVersionError(
            f"database is at revision {current}, this trm expects {head}; {UPGRADE_HINT}"
            " (or open_store(..., auto_upgrade=True))"
        )
    command.upgrade(alembic_config(connection), "head")
