"""trm_llm's settings, read from the environment and `.env`, checked once at start-up.

Each field is read from the upper-case variable of the same name (`llm_model` from `LLM_MODEL`);
`.env.example` documents them all. Bad values fail here, when the harness starts, with the
variable's name in the message (`LLMSettingsError`, which never echoes a value: the API key is a
`SecretStr` in the settings and must not leak through an error report either), rather than hours
later in a loop. Unknown `LLM_*` / `REDIS_*` names (a typo such as `REDIS_CACHE_TTLL` would
otherwise fall back to the default silently) are refused; other variables in a shared `.env`
are ignored, which is why this is not a blanket `extra="forbid"`. Nothing is built here:
`LLMSettings()` is called by the harness's bootstrap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasGenerator,
    Field,
    RedisDsn,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from trm_llm.api_key import check_api_key
from trm_llm.cache import check_namespace
from trm_llm.errors import APIKeyError, CacheTTLError, LLMSettingsError
from trm_llm.sse import PROFILES

__all__ = ["CacheTTLError", "CacheTarget", "LLMSettings", "LLMSettingsError", "resolve_cache_ttl"]

_OWN_PREFIXES = ("llm_", "redis_")
_CACHE_SCHEMES = ("sqlite", "redis", "rediss")


@dataclass(frozen=True, slots=True)
class CacheTarget:
    """Where the response cache lives: `path` for SQLite, `url` for Redis, neither when off."""

    backend: Literal["sqlite", "redis", "off"]
    path: Path | None = None
    url: str | None = None


def _cache_url_problem(url: str) -> str | None:
    if url == "off":
        return None
    parts = urlsplit(url)
    if parts.scheme not in _CACHE_SCHEMES:
        return "LLM_CACHE_URL must be sqlite:///PATH, redis://HOST..., rediss://... or off"
    if parts.scheme == "sqlite" and (parts.netloc or len(parts.path) < 2):
        return "LLM_CACHE_URL sqlite:///PATH needs a file path (three slashes, then the path)"
    if parts.scheme != "sqlite" and not parts.netloc:
        return "LLM_CACHE_URL redis://HOST[:PORT][/DB] needs a host"
    return None


def resolve_cache_ttl(ttl: object) -> int:
    """Return `ttl` if it is a positive int; refuse 0 ("never expire" is not a TTL), bool, etc."""
    if isinstance(ttl, bool) or not isinstance(ttl, int):
        raise CacheTTLError(
            f"REDIS_CACHE_TTL must be a positive integer number of seconds, got {ttl!r}"
        )
    if ttl <= 0:
        raise CacheTTLError(
            f"REDIS_CACHE_TTL must be a positive integer number of seconds, got {ttl}; "
            "0 does not mean 'never expire': pick a TTL at least as long as a training run "
            "(e.g. 86400)"
        )
    return ttl


class LLMSettings(BaseSettings):
    """Where the LLM is, how the response cache is kept, and the retry, concurrency and
    breaker knobs."""

    model_config = SettingsConfigDict(
        env_file=".env",
        env_file_encoding="utf-8",
        env_ignore_empty=True,
        extra="ignore",
        alias_generator=AliasGenerator(validation_alias=str.upper),
        validate_by_name=True,
        validate_by_alias=True,
        frozen=True,
        hide_input_in_errors=True,
    )

    llm_base_url: str = Field(
        description=(
            "OpenAI-compatible base URL (required); /chat/completions is appended. http or https "
            "only."
        )
    )
    llm_model: str = Field(
        description="Model name sent with every request and part of every cache key (required)."
    )
    llm_api_key: SecretStr | None = Field(
        default=None,
        description=(
            "Bearer token; optional (local servers need none). Kept as a secret: never logged or "
            "stored in events."
        ),
    )
    llm_profile: str = Field(
        default="strict",
        description=(
            "SSE dialect: strict (default: [DONE] and a finish_reason required) or "
            "lenient_finish_null (servers known to end with finish_reason null and no [DONE])."
        ),
    )
    llm_source: str | None = Field(
        default=None,
        description=(
            "Name of this provider in events and breaker state (stream llm:<source>); empty means"
            " the model name."
        ),
    )
    llm_first_token_timeout_s: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Seconds to wait for the first streamed data event before the attempt is a "
            "stall_first_token."
        ),
    )
    llm_inter_token_timeout_s: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Longest gap in seconds between data events (keep-alive comments do not count) before"
            " stall_inter_token."
        ),
    )

    llm_cache_url: str | None = Field(
        default=None,
        description=(
            "The response cache as one URL: sqlite:///path/cache.db, redis://host:6379/0 "
            "(rediss:// too) or off. Set, it replaces LLM_CACHE_BACKEND and "
            "LLM_CACHE_SQLITE_PATH (set either too and start-up fails)."
        ),
    )
    llm_cache_backend: Literal["sqlite", "redis", "off"] = Field(
        default="sqlite",
        description="Where complete answers are cached: sqlite (embedded default), redis, or off.",
    )
    llm_cache_sqlite_path: Path = Field(
        default=Path("trm_llm_cache.db"),
        description=(
            "The SQLite cache file (LLM_CACHE_BACKEND=sqlite); its directory is created on first "
            "use."
        ),
    )
    llm_cache_namespace: str = Field(
        default="trm:llm",
        description=(
            "Prefix of every cache key name (Redis) / namespace column (SQLite): 1-100 chars of "
            "[A-Za-z0-9_.:-]."
        ),
    )
    llm_cache_length: bool = Field(
        default=False,
        description=(
            'Also cache answers cut off by max_tokens (finish_reason "length"): true or false.'
        ),
    )
    redis_url: RedisDsn | None = Field(
        default=None,
        description=(
            "Redis URL, required when LLM_CACHE_BACKEND=redis, e.g. redis://127.0.0.1:6379/0 "
            "(redis:// or rediss://)."
        ),
    )
    redis_cache_ttl: int = Field(
        default=86400,
        description=(
            "Cache entry lifetime in seconds, for either backend: a positive integer (0 is "
            'refused: it does not mean "never expire"); at least one training run.'
        ),
    )

    llm_max_attempts: int = Field(
        default=4, ge=1, le=100, description="Attempts per call, first one included (1-100)."
    )
    llm_base_delay_s: float = Field(
        default=0.5,
        ge=0,
        allow_inf_nan=False,
        description=(
            "First backoff step in seconds (full jitter, doubling; 0 allowed); must not exceed "
            "LLM_MAX_DELAY_S."
        ),
    )
    llm_max_delay_s: float = Field(
        default=20.0, ge=0, allow_inf_nan=False, description="Largest single backoff in seconds."
    )
    llm_deadline_s: float = Field(
        default=120.0,
        gt=0,
        allow_inf_nan=False,
        description="Total time budget of one call in seconds, retries included.",
    )
    llm_retry_after_cap_s: float = Field(
        default=60.0,
        ge=0,
        allow_inf_nan=False,
        description="Longest Retry-After (seconds) honoured from a 429/503.",
    )

    llm_breaker_fail_threshold: int = Field(
        default=5, ge=1, description="Consecutive failures that open the breaker."
    )
    llm_breaker_cooldown_s: float = Field(
        default=30.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            "Seconds the breaker stays open before admitting exactly one probe (0 allowed)."
        ),
    )
    llm_breaker_probe_timeout_s: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Seconds after which a probe that never reported loses its lease (the breaker cannot "
            "wedge shut)."
        ),
    )
    llm_concurrency_initial: int = Field(
        default=4,
        ge=1,
        description=(
            "Calls in flight per endpoint at first; the limiter then learns the limit (floor 1): "
            "shrinks on overload, grows on success."
        ),
    )
    llm_concurrency_ceiling: int = Field(
        default=32,
        ge=1,
        description=(
            "Most calls in flight per endpoint the limiter ever allows; at least "
            "LLM_CONCURRENCY_INITIAL."
        ),
    )
    llm_breaker_shared: bool = Field(
        default=False,
        description=(
            "Share breaker state through REDIS_URL so several processes admit one probe in all: "
            "true or false."
        ),
    )

    def __init__(self, **values: Any) -> None:
        """Validate; on failure raise `LLMSettingsError` carrying no raw input (the API key)."""
        problem: str | None = None
        try:
            super().__init__(**values)
        except ValidationError as exc:  # its .errors() would carry every raw input, the key too
            problem = str(exc)  # hide_input_in_errors: names and messages only
        if problem is not None:
            raise LLMSettingsError(problem)

    @classmethod
    def from_values(cls, **values: Any) -> LLMSettings:
        """Settings from `values` alone, neither the environment nor `.env` read: for a harness
        that decides every knob itself (the demo), so a shell's LLM_* cannot change it."""
        return _ValuesOnly(**values)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_own_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = set(cls.model_fields)
            unknown = sorted(
                str(name).upper()
                for name in data
                if str(name).lower().startswith(_OWN_PREFIXES) and str(name).lower() not in known
            )
            if unknown:
                raise ValueError(f"unknown setting(s) {', '.join(unknown)}; see .env.example")
        return data

    @field_validator("llm_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"LLM_BASE_URL must be an http(s) URL with a host, got {value!r}")
        return value.strip().rstrip("/")

    @field_validator("llm_model", "llm_source")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank")
        return None if value is None else value.strip()

    @field_validator("llm_api_key")
    @classmethod
    def _header_safe_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            try:
                check_api_key(value.get_secret_value())
            except APIKeyError as exc:
                raise ValueError(f"LLM_API_KEY: {exc}") from None
        return value

    @field_validator("llm_profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        if value not in PROFILES:
            raise ValueError(f"LLM_PROFILE must be one of {sorted(PROFILES)}, got {value!r}")
        return value

    @field_validator("llm_cache_namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        try:
            return check_namespace(value)
        except ValueError as exc:
            raise ValueError(f"LLM_CACHE_NAMESPACE: {exc}") from None

    @field_validator("llm_cache_sqlite_path")
    @classmethod
    def _not_a_directory(cls, value: Path) -> Path:
        if value.is_dir():
            raise ValueError(f"LLM_CACHE_SQLITE_PATH {str(value)!r} is a directory, not a file")
        return value

    @field_validator("redis_cache_ttl", mode="before")
    @classmethod
    def _positive_ttl(cls, value: object) -> int:
        if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
            value = int(value)
        return resolve_cache_ttl(value)

    @field_validator("llm_cache_url")
    @classmethod
    def _cache_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = _cache_url_problem(value.strip())
        if problem is not None:
            raise ValueError(problem)
        return value.strip()

    def cache_target(self) -> CacheTarget:
        """Where the response cache lives: LLM_CACHE_URL if set, else LLM_CACHE_BACKEND with
        LLM_CACHE_SQLITE_PATH or REDIS_URL."""
        url = self.llm_cache_url
        if url is None:
            if self.llm_cache_backend == "sqlite":
                return CacheTarget("sqlite", path=self.llm_cache_sqlite_path)
            if self.llm_cache_backend == "redis":
                return CacheTarget("redis", url=str(self.redis_url))
            return CacheTarget("off")
        if url == "off":
            return CacheTarget("off")
        if url.startswith("sqlite:"):
            return CacheTarget("sqlite", path=Path(urlsplit(url).path[1:]))
        return CacheTarget("redis", url=url)

    @model_validator(mode="after")
    def _consistent(self) -> LLMSettings:
        both = {"llm_cache_backend", "llm_cache_sqlite_path"} & self.model_fields_set
        if self.llm_cache_url is not None and both:
            names = ", ".join(sorted(n.upper() for n in both))
            raise ValueError(f"LLM_CACHE_URL replaces {names}: set one or the other")
        target = self.cache_target()
        if target.path is not None and target.path.is_dir():
            raise ValueError(f"the cache file {str(target.path)!r} is a directory")
        if self.llm_cache_backend == "redis" and self.redis_url is None:
            raise ValueError("LLM_CACHE_BACKEND=redis needs REDIS_URL")
        if self.llm_concurrency_initial > self.llm_concurrency_ceiling:
            raise ValueError("LLM_CONCURRENCY_INITIAL must not exceed LLM_CONCURRENCY_CEILING")
        if self.llm_breaker_shared and self.redis_url is None:
            raise ValueError("LLM_BREAKER_SHARED=true needs REDIS_URL")
        if self.llm_base_delay_s > self.llm_max_delay_s:
            raise ValueError("LLM_BASE_DELAY_S must not exceed LLM_MAX_DELAY_S")
        return self


class _ValuesOnly(LLMSettings):
    """`LLMSettings.from_values`: the same fields and checks, only the values passed in."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)
