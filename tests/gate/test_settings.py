"""`GateSettings` (issue 17 point 5): gate parameters from a file and the environment, with
overrides > env > file > defaults, and a typed error for anything no gate can be built from."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trm_gate import Gate, GateConfig, GateInputError, GateSettings, GateSettingsError
from trm_store import Store


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("TRM_GATE_"):
            monkeypatch.delenv(name)


def test_defaults_are_the_gates() -> None:
    assert GateSettings().config() == GateConfig()
    assert GateSettings().infra_reasons == frozenset({"error", "parse_error"})


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gate.toml"
    path.write_text(
        '[gate]\nalpha = 0.01\nbeta = 0.1\nblock_size = 30\ninfra_reasons = ["error"]\n'
    )
    monkeypatch.setenv("TRM_GATE_BETA", "0.3")
    s = GateSettings.load(path, defaults={"block_size": 12, "p1": 0.7}, alpha=0.02)
    assert (s.alpha, s.beta, s.block_size, s.p1) == (0.02, 0.3, 30, 0.7)
    assert s.infra_reasons == frozenset({"error"})
    # The file named by TRM_GATE_CONFIG, JSON this time; the env still wins over it.
    other = tmp_path / "gate.json"
    other.write_text(json.dumps({"alpha": 0.04, "infra_policy": "exclude"}))
    monkeypatch.setenv("TRM_GATE_CONFIG", str(other))
    monkeypatch.setenv("TRM_GATE_INFRA_REASONS", '["error", "parse_error", "length"]')
    s = GateSettings.load()
    assert (s.alpha, s.beta, s.infra_policy) == (0.04, 0.3, "exclude")
    assert s.infra_reasons == frozenset({"error", "parse_error", "length"})


def test_gate_from_settings(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRM_GATE_P1", "0.65")
    monkeypatch.setenv("TRM_GATE_MAX_PAIRS", "50")
    gate = Gate.from_settings(store, GateSettings.load())
    assert gate.config == GateConfig(p1=0.65, max_pairs=50)


@pytest.mark.parametrize(
    ("env", "value", "why"),
    [
        ("TRM_GATE_ALPHA", "1.5", "alpha"),
        ("TRM_GATE_ALPHA", "nope", "alpha"),
        ("TRM_GATE_P1", "0.4", "p1"),
        ("TRM_GATE_BLOCK_SIZE", "0", "block_size"),
        ("TRM_GATE_INFRA_POLICY", "ignore", "infra_policy"),
        ("TRM_GATE_INFRA_REASONS", '["timeout"]', "timeout"),
        ("TRM_GATE_INFRA_REASONS", "error", "infra_reasons"),
        ("TRM_GATE_INFRA_MAX_RATE", "2", "infra_max_rate"),
    ],
)
def test_bad_env_is_a_typed_error(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, why: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(GateSettingsError, match=why) as info:
        GateSettings.load()
    assert isinstance(info.value, GateInputError)


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [
        ("gate.toml", "alpha = ", "not valid"),
        ("gate.json", "[1, 2]", "table of settings"),
        ("gate.json", '{"alpah": 0.1}', "alpah"),
        ("missing.toml", None, "cannot read"),
        # Before: a raw UnicodeDecodeError, a block size of 1, a margin of 0.0, a hang.
        ("latin1.toml", b"alpha = 0.1 # \xe9\n", "not UTF-8"),
        ("gate.json", '{"block_size": true}', "block_size"),
        ("gate.toml", "infra_margin = false", "infra_margin"),
        ("fifo.toml", "fifo", "not a regular file"),
        ("dir.toml", "dir", "not a regular file"),
    ],
)
def test_bad_file_is_a_typed_error(
    tmp_path: Path, name: str, text: str | bytes | None, why: str
) -> None:
    path = tmp_path / name
    if text == "fifo":
        os.mkfifo(path)
    elif text == "dir":
        path.mkdir()
    elif isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(GateSettingsError, match=why):
        GateSettings.load(path)
