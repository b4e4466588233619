"""Schema versioning: find the migrations (repo or wheel), create new databases, refuse old ones."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect

from trm_store.errors import SchemaVersionError

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


def ensure_schema(connection: Connection, *, auto_upgrade: bool, writable: bool) -> None:
    """Create a new database at head; upgrade or refuse one at an older revision.

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
    if not writable:
        state = "is empty" if is_new else f"is at revision {current}, this trm expects {head}"
        raise SchemaVersionError(f"read-only store {state}; {UPGRADE_HINT}")
    if not (is_new or auto_upgrade):
        raise SchemaVersionError(
            f"database is at revision {current}, this trm expects {head}; {UPGRADE_HINT}"
            " (or open_store(..., auto_upgrade=True))"
        )
    command.upgrade(alembic_config(connection), "head")
