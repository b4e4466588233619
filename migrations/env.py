"""alembic environment: runs on a connection the store hands in, or on TRM_STORE_URL (CLI)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from trm_store.schema import METADATA


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=METADATA,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_from_cli() -> None:
    from trm_store.connect import create_backend, default_url

    backend = create_backend(default_url(None), read_only=False, durability="normal")
    with backend.write_transaction() as connection:
        _run(connection)
    backend.engine.dispose()


if context.is_offline_mode():
    raise SystemExit(
        "trm migrations run online only: set TRM_STORE_URL and run `alembic upgrade head`"
    )

_connection = context.config.attributes.get("connection")
if _connection is None:
    _run_from_cli()
else:
    _run(_connection)
