"""Settings come from env and .env; bad values stop start-up, named; the API key stays secret.

Seed task 2 (`test_redis_cache_ttl_zero_rejected`): REDIS_CACHE_TTL=0 silently meant "never
expire", so stale answers outlived every epoch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

import trm_llm.settings as settings_module
from trm_llm.settings import CacheTTLError, LLMSettings, LLMSettingsError, resolve_cache_ttl

EXAMPLE = Path(__file__).resolve().parents[2] / ".env.example"
SECRET = "sk-live-0123456789abcdef"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No inherited LLM_*/REDIS_* variables, and a working directory without a .env."""
    for name in list(os.environ):
        if name.upper().startswith(("LLM_", "REDIS_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:8765/v1")
    monkeypatch.setenv("LLM_MODEL", "smol")


def test_resolve_cache_ttl_refuses_non_positive() -> None:
    with pytest.raises(ValueError, match="REDIS_CACHE_TTL"):
        resolve_cache_ttl(0)
    with pytest.raises(ValueError, match="REDIS_CACHE_TTL"):
        resolve_cache_ttl(-1)
    assert resolve_cache_ttl(86400) == 86400


@pytest.mark.parametrize("ttl", [True, False, 1.5, 60.0, "60", None])
def test_resolve_cache_ttl_refuses_non_ints(ttl: Any) -> None:
    with pytest.raises(CacheTTLError, match="REDIS_CACHE_TTL"):
        resolve_cache_ttl(ttl)


def test_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "LLM_BASE_URL": "https://api.example.org/v1/",
        "LLM_MODEL": "gpt-x",
        "LLM_API_KEY": SECRET,
        "LLM_CACHE_BACKEND": "redis",
        "REDIS_URL": "redis://127.0.0.1:6379/2",
        "REDIS_CACHE_TTL": "3600",
        "LLM_MAX_ATTEMPTS": "6",
        "LLM_BREAKER_COOLDOWN_S": "2.5",
    }.items():
        monkeypatch.setenv(name, value)
    s = LLMSettings()
    assert s.llm_base_url == "https://api.example.org/v1"
    assert (s.llm_model, s.llm_cache_backend, s.redis_cache_ttl) == ("gpt-x", "redis", 3600)
    assert str(s.redis_url) == "redis://127.0.0.1:6379/2"
    assert (s.llm_max_attempts, s.llm_breaker_cooldown_s) == (6, 2.5)
    assert s.llm_api_key is not None and s.llm_api_key.get_secret_value() == SECRET


def test_defaults_are_the_embedded_ones(required: None) -> None:
    s = LLMSettings()
    assert (s.llm_cache_backend, s.redis_cache_ttl, s.llm_api_key) == ("sqlite", 86400, None)
    assert (s.llm_max_attempts, s.llm_breaker_fail_threshold) == (4, 5)


def test_reads_dotenv_and_the_environment_wins(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (clean_env / ".env").write_text(
        "LLM_BASE_URL=http://h:1/v1\nLLM_MODEL=from-file\nREDIS_CACHE_TTL=120\n"
        "TRM_STORE_URL=sqlite:///x.db\nSOME_OTHER_TOOL=1\n"  # other tools' variables are ignored
    )
    assert (LLMSettings().llm_model, LLMSettings().redis_cache_ttl) == ("from-file", 120)
    monkeypatch.setenv("LLM_MODEL", "from-env")
    assert LLMSettings().llm_model == "from-env"


def test_reads_a_named_env_file(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.env"
    path.write_text("LLM_BASE_URL=http://h:1/v1\nLLM_MODEL=named\nLLM_API_KEY=\n")
    s = LLMSettings(_env_file=path)
    assert (s.llm_model, s.llm_api_key) == ("named", None)  # empty means unset


def test_ttl_zero_in_dotenv_stops_start_up(clean_env: Path) -> None:
    (clean_env / ".env").write_text("LLM_BASE_URL=http://h/v1\nLLM_MODEL=m\nREDIS_CACHE_TTL=0\n")
    with pytest.raises(LLMSettingsError, match="REDIS_CACHE_TTL") as err:
        LLMSettings()
    assert "positive integer" in str(err.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REDIS_CACHE_TTL", "0"),
        ("REDIS_CACHE_TTL", "-5"),
        ("REDIS_CACHE_TTL", "1.5"),
        ("REDIS_CACHE_TTL", "a day"),
        ("LLM_BASE_URL", "ftp://h/v1"),
        ("LLM_BASE_URL", "127.0.0.1:8765"),
        ("LLM_MODEL", "   "),
        ("LLM_PROFILE", "loose"),
        ("LLM_CACHE_BACKEND", "memcached"),
        ("LLM_CACHE_NAMESPACE", "has space"),
        ("LLM_CACHE_SQLITE_PATH", "."),
        ("REDIS_URL", "http://127.0.0.1:6379"),
        ("LLM_MAX_ATTEMPTS", "0"),
        ("LLM_BASE_DELAY_S", "nan"),
        ("LLM_MAX_DELAY_S", "-1"),
        ("LLM_SOURCE", "  "),
        ("LLM_FIRST_TOKEN_TIMEOUT_S", "0"),
        ("LLM_INTER_TOKEN_TIMEOUT_S", "-3"),
        ("LLM_CACHE_LENGTH", "maybe"),
        ("LLM_BREAKER_SHARED", "sometimes"),
        ("LLM_DEADLINE_S", "0"),
        ("LLM_RETRY_AFTER_CAP_S", "-1"),
        ("LLM_BREAKER_FAIL_THRESHOLD", "0"),
        ("LLM_BREAKER_COOLDOWN_S", "inf"),
        ("LLM_BREAKER_COOLDOWN_S", "-1"),
        ("LLM_BREAKER_PROBE_TIMEOUT_S", "0"),
    ],
)
def test_bad_value_stops_start_up_naming_the_variable(
    required: None, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(LLMSettingsError) as err:
        LLMSettings()
    assert name in str(err.value)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"LLM_MODEL": "m"}, "LLM_BASE_URL"),
        ({"LLM_BASE_URL": "http://h/v1"}, "LLM_MODEL"),
        (
            {"LLM_BASE_URL": "http://h/v1", "LLM_MODEL": "m", "LLM_CACHE_BACKEND": "redis"},
            "REDIS_URL",
        ),
        ({"LLM_BASE_URL": "http://h/v1", "LLM_MODEL": "m", "LLM_BREAKER_SHARED": "1"}, "REDIS_URL"),
        (
            {"LLM_BASE_URL": "http://h/v1", "LLM_MODEL": "m", "LLM_BASE_DELAY_S": "30"},
            "LLM_MAX_DELAY_S",
        ),
    ],
)
def test_missing_or_inconsistent_settings_are_named(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(LLMSettingsError, match=named):
        LLMSettings()


def test_unknown_own_variable_in_dotenv_is_refused(required: None, clean_env: Path) -> None:
    (clean_env / ".env").write_text("REDIS_CACHE_TTLL=0\n")  # typo: would silently keep 86400
    with pytest.raises(LLMSettingsError, match="REDIS_CACHE_TTLL"):
        LLMSettings()


def test_unknown_keyword_is_refused(required: None) -> None:
    with pytest.raises(LLMSettingsError, match="LLM_RETRIES"):
        LLMSettings(llm_retries=3)


def test_api_key_never_shown(required: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", SECRET)
    s = LLMSettings()
    for shown in (repr(s), str(s), s.model_dump_json(), str(s.model_dump())):
        assert SECRET not in shown
    monkeypatch.setenv("LLM_CACHE_BACKEND", "redis")  # a whole-model error must not echo inputs
    with pytest.raises(LLMSettingsError, match="REDIS_URL") as err:
        LLMSettings()
    assert SECRET not in repr(err.value.args)
    assert err.value.__cause__ is None and err.value.__context__ is None


def test_env_example_documents_every_setting_and_loads(tmp_path: Path) -> None:
    lines = EXAMPLE.read_text().splitlines()
    assignments = [
        (i, line.split("=", 1)[0]) for i, line in enumerate(lines) if re.match(r"[A-Z]", line)
    ]
    documented = [name for _, name in assignments]
    assert sorted(documented) == sorted(name.upper() for name in LLMSettings.model_fields)
    assert len(documented) == len(set(documented))
    for i, name in assignments:
        assert lines[i - 1].startswith("# "), f"{name} has no comment line above it"
    assert LLMSettings(_env_file=EXAMPLE).llm_cache_backend == "sqlite"


def test_nothing_is_built_at_import() -> None:
    assert not any(isinstance(value, LLMSettings) for value in vars(settings_module).values())
