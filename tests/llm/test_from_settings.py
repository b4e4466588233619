"""`client_from_settings`: the client, cache, breaker, retries and concurrency limiter that
`LLMSettings` describe; switching the response cache from SQLite to Redis is one variable."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import redis

from trm_llm import (
    CircuitBreaker,
    CircuitOpenError,
    ConcurrencyLimiter,
    LLMSettings,
    LLMSettingsError,
    RetriesExhausted,
    client_from_settings,
)
from trm_llm.simulated_server import SimulatedServer, status

from .conftest import USER, ListSink


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No inherited LLM_*/REDIS_* variables, and a working directory without a .env."""
    for name in list(os.environ):
        if name.upper().startswith(("LLM_", "REDIS_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def _env(monkeypatch: pytest.MonkeyPatch, server: SimulatedServer, **values: str) -> None:
    monkeypatch.setenv("LLM_BASE_URL", server.base_url)
    monkeypatch.setenv("LLM_MODEL", "sim")
    for name, value in values.items():
        monkeypatch.setenv(name, value)


async def test_the_settings_build_every_part(
    server: SimulatedServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sink: ListSink
) -> None:
    path = tmp_path / "cache" / "answers.db"
    _env(
        monkeypatch,
        server,
        LLM_CACHE_URL=f"sqlite:///{path}",
        LLM_CONCURRENCY_INITIAL="2",
        LLM_CONCURRENCY_CEILING="6",
        LLM_BREAKER_FAIL_THRESHOLD="7",
        LLM_MAX_ATTEMPTS="3",
        LLM_SOURCE="local",
    )
    async with client_from_settings(LLMSettings(), sink=sink) as client:
        assert isinstance(client.limiter, ConcurrencyLimiter)
        assert (client.limiter.limit, client.limiter.ceiling) == (2, 6)
        assert isinstance(client.breaker, CircuitBreaker)
        assert client.breaker.fail_threshold == 7 and client.source == "local"
        first, second = await client.chat(USER), await client.chat(USER)
    assert (first.cached, second.cached) == (False, True)
    assert path.is_file() and server.request_count == 1
    assert [s for s, kind, _ in sink.events if kind == "call_completed"] == ["local", "local"]


@pytest.mark.redis
async def test_switching_the_cache_to_redis_is_one_variable(
    server: SimulatedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = f"test:fs:{uuid.uuid4().hex[:12]}"
    _env(
        monkeypatch,
        server,
        LLM_CACHE_URL="redis://127.0.0.1:6379/0",
        LLM_CACHE_NAMESPACE=namespace,
    )
    async with client_from_settings(LLMSettings()) as client:
        first, second = await client.chat(USER), await client.chat(USER)
    assert (first.cached, second.cached) == (False, True) and server.request_count == 1
    sync = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        keys = sync.keys(f"{namespace}:*")
        assert len(keys) == 1
        sync.delete(*keys)
    finally:
        sync.close()
    assert not list(Path.cwd().iterdir())  # no SQLite file was made


@pytest.mark.redis
async def test_a_shared_breaker_keeps_its_state_in_redis(
    server: SimulatedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = f"fs-{uuid.uuid4().hex[:12]}"
    _env(
        monkeypatch,
        server,
        LLM_CACHE_URL="off",
        LLM_BREAKER_SHARED="true",
        LLM_BREAKER_FAIL_THRESHOLD="1",
        LLM_MAX_ATTEMPTS="1",
        REDIS_URL="redis://127.0.0.1:6379/0",
        LLM_SOURCE=source,
    )
    server.default = status(500)
    try:
        async with client_from_settings(LLMSettings()) as client:
            with pytest.raises(RetriesExhausted):
                await client.chat(USER)
        async with client_from_settings(LLMSettings()) as other:  # as another process would
            with pytest.raises(CircuitOpenError):
                await other.chat(USER)
        assert server.request_count == 1
    finally:
        sync = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        keys = sync.keys(f"trm:breaker:{source}:*")
        if keys:
            sync.delete(*keys)
        sync.close()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"LLM_CACHE_URL": "postgres://h/db"}, "LLM_CACHE_URL must be"),
        ({"LLM_CACHE_URL": "sqlite://"}, "needs a file path"),
        ({"LLM_CACHE_URL": "redis://"}, "needs a host"),
        ({"LLM_CACHE_URL": "off", "LLM_CACHE_BACKEND": "sqlite"}, "replaces LLM_CACHE_BACKEND"),
        ({"LLM_CACHE_URL": "off", "LLM_CACHE_SQLITE_PATH": "x.db"}, "LLM_CACHE_SQLITE_PATH"),
        ({"LLM_CONCURRENCY_INITIAL": "0"}, "LLM_CONCURRENCY_INITIAL"),
        (
            {"LLM_CONCURRENCY_INITIAL": "9", "LLM_CONCURRENCY_CEILING": "8"},
            "must not exceed LLM_CONCURRENCY_CEILING",
        ),
    ],
)
def test_bad_cache_and_concurrency_settings_stop_start_up(
    monkeypatch: pytest.MonkeyPatch, values: dict[str, str], message: str
) -> None:
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("LLM_MODEL", "m")
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(LLMSettingsError, match=message):
        LLMSettings()


def test_the_cache_target_of_each_way_of_saying_it(tmp_path: Path) -> None:
    base = {"llm_base_url": "http://h/v1", "llm_model": "m"}
    url = LLMSettings.from_values(**base, llm_cache_url=f"sqlite:///{tmp_path}/c.db")
    assert url.cache_target().path == tmp_path / "c.db"
    assert LLMSettings.from_values(**base, llm_cache_url="off").cache_target().backend == "off"
    old = LLMSettings.from_values(**base, llm_cache_sqlite_path=tmp_path / "d.db")
    assert old.cache_target().path == tmp_path / "d.db"
    redis_url = LLMSettings.from_values(**base, llm_cache_url="rediss://r:6380/1").cache_target()
    assert (redis_url.backend, redis_url.url) == ("redis", "rediss://r:6380/1")


def test_from_values_reads_neither_the_environment_nor_dotenv(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLM_PROFILE", "no-such-profile")
    (tmp_path / ".env").write_text("LLM_CACHE_BACKEND=redis\n")
    settings = LLMSettings.from_values(llm_base_url="http://h/v1", llm_model="m")
    assert (settings.llm_profile, settings.llm_cache_backend) == ("strict", "sqlite")
    assert isinstance(settings, LLMSettings)
