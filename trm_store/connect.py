"""From a store URL to its backend: the default URL, URL spellings, and the backend chosen."""

from __future__ import annotations

import os

from trm_store.backend import Backend, Durability
from trm_store.errors import StoreError, StoreURLError
from trm_store.postgres import PostgresBackend
from trm_store.sqlite import SqliteBackend
from trm_store.store_url import check_postgres_query, parse_store_url

__all__ = ["DEFAULT_URL", "create_backend", "default_url", "normalise_url"]

DEFAULT_URL = "sqlite:///trm.db"


def default_url(url: str | None) -> str:
    """`url`, else TRM_STORE_URL, else ./trm.db."""
    return url or os.environ.get("TRM_STORE_URL") or DEFAULT_URL


def normalise_url(url: str) -> str:
    """Accept plain `postgresql://` URLs by selecting the psycopg 3 driver we ship with."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def create_backend(url: str, *, read_only: bool, durability: Durability) -> Backend:
    """The backend for `url` (sqlite or postgresql); a URL trm cannot honour as written raises
    StoreURLError (`trm_store.store_url`)."""
    if durability not in ("normal", "full"):
        raise StoreError(f"durability must be 'normal' or 'full', got {durability!r}")
    parsed = parse_store_url(normalise_url(url))
    if parsed.get_backend_name() == "sqlite":
        return SqliteBackend(parsed, read_only=read_only, durability=durability)
    if parsed.get_backend_name() == "postgresql":
        check_postgres_query(parsed)
        return PostgresBackend(parsed, read_only=read_only)
    raise StoreURLError(
        f"unsupported database {parsed.get_backend_name()!r}: use sqlite or postgresql"
    )
