"""Shared fixtures: real SQLite files and a fresh schema on the local PostgreSQL per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.demo_store import DemoStore, make_demo_store
from tests.llm.private_redis import PrivateRedis, running_redis
from trm_store import Store, open_store

PG_URL = os.environ.get("TRM_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_schema_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a brand-new schema, dropped afterwards."""
    schema = "t_" + uuid.uuid4().hex[:16]
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'trm.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from _pg_schema_url()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The same test on a SQLite file and on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'trm.db'}"
    else:
        yield from _pg_schema_url()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A store on each backend with every registered projection (tests/store overrides it)."""
    with open_store(store_url) as s:
        yield s


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A redis-server of this test's own, on another port: it may be frozen, killed, restarted."""
    with running_redis() as server:
        yield server


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> DemoStore:
    """A store filled by `trm demo` plus a run of hostile strings (tests/demo_store.py), made
    once per session: tests that use it only read it."""
    return make_demo_store(tmp_path_factory.mktemp("demo"))
