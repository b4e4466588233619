"""Store URLs a hostile reviewer wrote: secrets in libpq query parameters, malformed URLs, other
drivers and SQLite URLs with an authority part.

Every one is opened as written or refused with `StoreURLError`, whose message, like every
message naming the store and `Store.url`, shows no secret; a refused URL creates nothing, and
the CLI prints the refusal on one line and exits 2.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, inspect, make_url

from tests.store.helpers import TOTALS
from trm_store import StoreError, StoreURLError, open_store, store_url
from trm_store.cli import main

SECRET = "hunter2-s3cret"
PG = "postgresql://postgres@127.0.0.1:5432"


def _written(secret: str) -> list[str]:
    """The forms a secret may take in a message: as given, and percent-encoded."""
    return [secret, quote(secret, safe=""), quote_plus(secret, safe="")]


def _assert_hidden(secret: str, *texts: str) -> None:
    for text in texts:
        for form in _written(secret):
            assert form not in text, f"{form!r} shown in {text!r}"


# -- secrets in query parameters ---------------------------------------------------------------

_SECRETS = st.text(st.characters(exclude_categories=("Cs",)), max_size=20).map(lambda s: "pw-" + s)
_SECRET_NAMES = st.sampled_from(["password", "sslpassword"])


@settings(max_examples=30, deadline=None)
@given(secret=_SECRETS, name=_SECRET_NAMES)
def test_a_secret_in_a_refused_postgresql_url_is_never_shown(secret: str, name: str) -> None:
    value = quote(secret, safe="")
    for url in (
        f"{PG}/test?{name}={value}&sslmdoe=require",  # a typo'd parameter
        f"{PG}/test?{name}={value}&sslmode=",  # a parameter without a value
        f"postgresql://postgres:{value}@127.0.0.1:5432/test?sslmdoe=require",
    ):
        with pytest.raises(StoreURLError) as info:
            open_store(url)
        _assert_hidden(secret, str(info.value))


@settings(max_examples=15, deadline=None)
@given(secret=_SECRETS, name=_SECRET_NAMES)
def test_a_secret_is_not_shown_when_the_connection_fails(secret: str, name: str) -> None:
    with pytest.raises(StoreError) as info:
        open_store(f"{PG}/trm_no_such_db?{name}={quote(secret, safe='')}&connect_timeout=5")
    _assert_hidden(secret, str(info.value))


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(secret=_SECRETS, name=_SECRET_NAMES)
def test_store_url_and_describe_hide_a_secret_query_parameter(
    pg_url: str, secret: str, name: str
) -> None:
    # Trust authentication: libpq sends no password, so any secret opens the store.
    try:
        store = open_store(f"{pg_url}&{name}={quote(secret, safe='')}", projections=TOTALS)
    except StoreURLError as e:  # control characters: refused, and not shown either
        _assert_hidden(secret, str(e))
        return
    with store:
        _assert_hidden(secret, store.url, store._backend.describe())
        assert f"{name}=***" in store.url


@settings(max_examples=30, deadline=None)
@given(secret=_SECRETS, name=st.sampled_from(["password", "PassWord", "sslpassword", "x_password"]))
def test_shown_url_masks_every_secret(secret: str, name: str) -> None:
    value = quote(secret, safe="")
    for url in (
        f"postgresql+psycopg://u:{value}@h:5432/d?{name}={value}&sslmode=require",
        f"sqlite:////srv/trm.db?mode=ro&{name}={value}",
        f"sqlite://u:{value}@/srv/trm.db?{name}={value}",
    ):
        shown = store_url.shown_url(make_url(url))
        _assert_hidden(secret, shown)
        assert f"{name}=***" in shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql+psycopg://u:pw@h:5432/d?sslmode=require&password=pw",
            "postgresql+psycopg://u:***@h:5432/d?password=***&sslmode=require",
        ),
        (
            "postgresql+psycopg://u@h/d?options=-csearch_path%3Dt",
            "postgresql+psycopg://u@h/d?options=-csearch_path%3Dt",
        ),
        ("sqlite:////srv/a:b.db?mode=ro&pw=x", "sqlite:////srv/a:b.db?mode=ro&pw=***"),
        ("sqlite://user:pw@/srv/trm.db", "sqlite://user:***@/srv/trm.db"),
        ("sqlite://otherhost:5/srv/trm.db", "sqlite://otherhost:5/srv/trm.db"),
    ],
)
def test_shown_url_keeps_what_is_no_secret(url: str, shown: str) -> None:
    assert store_url.shown_url(make_url(url)) == shown


# -- malformed URLs, other drivers, SQLite authorities -------------------------------------------


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


_REFUSED = [
    f"postgresql://postgres:{SECRET}@127.0.0.1:notaport/test",
    f"postgresql://postgres:{SECRET}@[::1/test",
    f"postgresql://postgres:{SECRET}@127.0.0.1:70000/test",
    f"postgresql://postgres:{SECRET}@127.0.0.1:0/test",
    f"postgresql://postgres:{SECRET}@127.0.0.1/te%00st",
    f"postgresql://postgres:{SECRET}%00@127.0.0.1/test",
    f"postgresql://postgres@127.0.0.1/test?password={SECRET}&application_name=a%0Ab",
    "sqlite:///{dir}/nul%00.db",
    "sqlite:///file:{dir}/nul%00.db?uri=true",
    "sqlite:///file:{dir}/nul%2500.db?uri=true",
    "sqlite:///{dir}/tab%09.db",
    f"postgresql+psycopg2://postgres:{SECRET}@127.0.0.1/test",
    f"postgresql+asyncpg://postgres:{SECRET}@127.0.0.1/test",
    f"postgresql+pg8000://postgres:{SECRET}@127.0.0.1/test",
    f"postgresql+psycopg_async://postgres:{SECRET}@127.0.0.1/test",
    "sqlite+aiosqlite:///{dir}/trm.db",
    f"sqlite://user:{SECRET}@/srv/trm.db",
    f"sqlite://:{SECRET}@/srv/trm.db",
    "sqlite://otherhost/srv/trm2.db",
    "sqlite://localhost/srv/trm3.db",
    "sqlite://:5/srv/trm4.db",
]


@pytest.mark.parametrize("url", _REFUSED)
def test_a_malformed_url_is_refused_typed_and_creates_nothing(cwd: Path, url: str) -> None:
    url = url.format(dir=cwd)
    with pytest.raises(StoreURLError) as info:
        open_store(url)
    _assert_hidden(SECRET, str(info.value))
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize("url", _REFUSED)
def test_the_cli_prints_a_refused_url_on_one_line(
    cwd: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "--db", url.format(dir=cwd)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("trm: StoreURLError: ") and err.count("\n") == 1, err
    _assert_hidden(SECRET, err)
    assert list(cwd.iterdir()) == []


@pytest.fixture
def empty_schema(pg_url: str) -> Iterator[str]:
    yield pg_url
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert inspect(conn).get_table_names() == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("driver", ["psycopg2", "asyncpg", "pg8000", "psycopg_async"])
def test_another_postgresql_driver_is_refused_before_connecting(
    empty_schema: str, driver: str
) -> None:
    url = empty_schema.replace("postgresql+psycopg://", f"postgresql+{driver}://")
    with pytest.raises(StoreURLError, match="psycopg"):
        open_store(url)


@pytest.mark.parametrize("prefix", ["postgresql://", "postgres://", "postgresql+psycopg://"])
def test_the_psycopg_spellings_still_open(pg_url: str, prefix: str) -> None:
    url = pg_url.replace("postgresql+psycopg://", prefix)
    with open_store(url, projections=TOTALS) as store:
        assert store.url.startswith("postgresql+psycopg://postgres@127.0.0.1:5432/test?")


@pytest.mark.parametrize("url", ["sqlite:///trm.db", "sqlite+pysqlite:///trm.db"])
def test_a_sqlite_url_without_authority_still_opens(cwd: Path, url: str) -> None:
    with open_store(url, projections=TOTALS) as store:
        assert store.url == f"sqlite:///{cwd / 'trm.db'}"
    assert os.path.isfile(cwd / "trm.db")
