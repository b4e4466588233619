"""`GateSettings`: the gate's parameters from a config file and the environment.

Precedence, highest first: keyword overrides given to `load`, environment variables
(`TRM_GATE_ALPHA`, `TRM_GATE_BLOCK_SIZE`, `TRM_GATE_INFRA_REASONS='["error"]'`, ...), the file
(TOML or JSON by its suffix; `path`, else `$TRM_GATE_CONFIG`), the caller's `defaults`, then
the gate's own defaults. Everything is validated at once, as `GateConfig` would (a rate out of
range, an unknown stop reason, an unknown key in the file): `GateSettingsError`, before a gate
is built or anything is written. `Gate.from_settings(store, settings)` builds the gate.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from trm_gate.config import GateConfig
from trm_gate.errors import GateInputError, GateSettingsError

__all__ = ["CONFIG_ENV", "GateSettings"]

CONFIG_ENV = "TRM_GATE_CONFIG"
"""The environment variable naming the settings file when `load` is given no path."""


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(GateConfig)}
"""The gate's own defaults, defined once (in `GateConfig`)."""


class GateSettings(BaseSettings):
    """The parameters `Gate(store, ...)` takes; see `GateConfig` for what each means."""

    model_config = SettingsConfigDict(
        env_prefix="TRM_GATE_", env_ignore_empty=True, extra="forbid", frozen=True
    )

    alpha: float = _DEFAULTS["alpha"]
    beta: float = _DEFAULTS["beta"]
    p1: float = _DEFAULTS["p1"]
    block_size: int = _DEFAULTS["block_size"]
    max_pairs: int | None = _DEFAULTS["max_pairs"]
    infra_max_rate: float = _DEFAULTS["infra_max_rate"]
    infra_min_units: int = _DEFAULTS["infra_min_units"]
    infra_policy: Literal["bounded", "exclude"] = _DEFAULTS["infra_policy"]
    infra_reasons: frozenset[str] = _DEFAULTS["infra_reasons"]
    infra_margin: float = _DEFAULTS["infra_margin"]
    infra_alpha: float = _DEFAULTS["infra_alpha"]

    @field_validator(
        "alpha",
        "beta",
        "p1",
        "block_size",
        "max_pairs",
        "infra_max_rate",
        "infra_min_units",
        "infra_margin",
        "infra_alpha",
        mode="before",
    )
    @classmethod
    def _no_bool(cls, value: object) -> object:
        """`true` in a file is not a number (pydantic would read it as 1). A GateInputError is a
        ValueError, which pydantic reports with the field (then a GateSettingsError)."""
        if isinstance(value, bool):
            raise GateInputError(f"must be a number, got {value!r}")
        return value

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except (ValidationError, SettingsError) as e:
            raise GateSettingsError(f"bad gate settings: {_message(e)}") from None

    @model_validator(mode="after")
    def _valid_gate(self) -> Self:
        self.config()  # GateInputError (a ValueError): pydantic reports it with the field
        return self

    def gate_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `Gate(store, **kwargs)`."""
        return self.model_dump()

    def config(self) -> GateConfig:
        """The `GateConfig` these settings describe."""
        return GateConfig(**self.gate_kwargs())

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        defaults: Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> GateSettings:
        """Settings from `overrides` > environment > file (`path` or `$TRM_GATE_CONFIG`) >
        `defaults` > the gate's defaults."""
        if path is None and os.environ.get(CONFIG_ENV):
            path = os.environ[CONFIG_ENV]
        from_file = {} if path is None else _read_file(Path(path))
        env = cls()  # the fields it sets are the ones the environment names
        from_env = env.model_dump(include=env.model_fields_set)
        return cls(**{**dict(defaults or {}), **from_file, **from_env, **overrides})


def _read_file(path: Path) -> dict[str, Any]:
    try:
        if path.exists() and not path.is_file():  # a FIFO would hang the read
            raise GateSettingsError(f"gate settings file {str(path)!r} is not a regular file")
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise GateSettingsError(f"cannot read gate settings file {str(path)!r}: {e}") from None
    except UnicodeDecodeError as e:
        raise GateSettingsError(f"gate settings file {str(path)!r} is not UTF-8: {e}") from None
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as e:
        raise GateSettingsError(f"gate settings file {str(path)!r} is not valid: {e}") from None
    if isinstance(data, dict) and isinstance(data.get("gate"), dict) and len(data) == 1:
        data = data["gate"]  # a [gate] table is allowed
    if not isinstance(data, dict):
        raise GateSettingsError(f"gate settings file {str(path)!r} must hold a table of settings")
    if isinstance(data.get("infra_reasons"), list):
        data["infra_reasons"] = frozenset(data["infra_reasons"])
    return data


def _message(error: ValidationError | SettingsError) -> str:
    if isinstance(error, SettingsError):
        return str(error)
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "settings"
        ctx = item.get("ctx", {}).get("error")
        text = str(ctx) if isinstance(ctx, GateInputError) else item["msg"]
        parts.append(f"{where}: {text}")
    return "; ".join(parts)
