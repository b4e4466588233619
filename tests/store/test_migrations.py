"""Schema versions: one head, models == migrations, old databases refused, wheel ships them."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from trm_store import SchemaVersionError, StoreError, open_store
from trm_store.migrate import alembic_config, head_revision
from trm_store.schema import METADATA

ROOT = Path(__file__).resolve().parents[2]


def test_there_is_exactly_one_head() -> None:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert heads == [head_revision()]


def test_the_models_match_the_migrations(store_url: str) -> None:
    open_store(store_url, projections={}).close()
    engine = create_engine(store_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), METADATA)
    finally:
        engine.dispose()
    assert diff == []


def _upgrade_to(url: str, revision: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), revision)
    finally:
        engine.dispose()


def test_an_old_database_is_refused_with_the_upgrade_command(store_url: str) -> None:
    _upgrade_to(store_url, "0001")
    with pytest.raises(SchemaVersionError, match="alembic upgrade head"):
        open_store(store_url)
    with pytest.raises(SchemaVersionError, match="alembic upgrade head"):
        open_store(store_url, read_only=True)
    with open_store(store_url, auto_upgrade=True, projections={}) as store:
        assert store.head_position() == 0
    engine = create_engine(store_url)
    try:
        assert inspect(engine).has_table("run_leases")
    finally:
        engine.dispose()


def test_a_new_database_is_created_at_head(store_url: str) -> None:
    open_store(store_url, projections={}).close()
    engine = create_engine(store_url)
    try:
        with engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == head_revision()
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("tampering", "refusal"),
    [
        ("DROP TABLE alembic_version", "no schema version"),  # trm tables without a version
        ("UPDATE alembic_version SET version_num = '9999'", "newer than this trm"),
    ],
)
def test_a_database_at_no_known_version_is_refused(
    sqlite_url: str, tampering: str, refusal: str
) -> None:
    open_store(sqlite_url, projections={}).close()
    engine = create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(tampering)
    engine.dispose()
    with pytest.raises(SchemaVersionError, match=refusal):
        open_store(sqlite_url)


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=r"not a trm store|corrupt"):
        open_store(f"sqlite:///{path}")


@pytest.mark.parametrize("url", ["mysql://nobody@127.0.0.1/x", "sqlite://", "not a url"])
def test_unsupported_urls_are_refused(url: str) -> None:
    with pytest.raises(StoreError):
        open_store(url)


def test_alembic_upgrade_head_from_the_repo_root(store_url: str) -> None:
    env = {**os.environ, "TRM_STORE_URL": store_url}
    alembic = Path(sys.executable).parent / "alembic"
    done = subprocess.run(
        [str(alembic), "upgrade", "head"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    with open_store(store_url, projections={}) as store:
        assert store.head_position() == 0


@pytest.mark.slow
def test_open_store_works_from_a_plain_wheel_install(tmp_path: Path) -> None:
    """Build the wheel, install it (no source tree) into a fresh venv, open a new store there."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next((tmp_path / "dist").glob("trm-*.whl"))
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    # Dependencies come from the test environment's site-packages; trm itself only from the wheel.
    site = next((fresh / "lib").glob("python3.*/site-packages"))
    deps = next(
        p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "sqlalchemy").is_dir()
    )
    (site / "deps.pth").write_text(f"{deps}\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    script = (
        "import trm_store, pathlib;"
        "import os; assert trm_store.__file__.startswith(os.environ['FRESH']), trm_store.__file__;"
        "s = trm_store.open_store('sqlite:///' + str(pathlib.Path('w.db').resolve()));"
        "print(s.head_position()); s.close()"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRM_STORE_URL")}
    env["FRESH"] = str(fresh)
    done = subprocess.run(
        [str(python), "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
