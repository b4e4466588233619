"""`trm demo` end to end, as a process on a temporary store: two epochs (the second reusing the
baseline cache), a real endpoint given by --base-url, an unreachable one, and bad arguments."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.helpers import child_env
from trm_store import cli, open_store
from trm_store.cli.demo import DEFAULT_SEED
from trm_store.cli.demo.faults import FaultPlan
from trm_store.cli.demo.model import SimulatedModel
from trm_store.cli.demo.server import DemoServer
from trm_store.domain.gates import list_gates
from trm_store.domain.llm_calls import llm_calls, llm_stats
from trm_store.domain.runs import read_predictions, run_info
from trm_store.domain.workspace import get_manifest
from trm_store.store import Store

TRM = [sys.executable, "-m", "trm_store.cli"]
VERDICTS = {"accept", "reject", "inconclusive", "infra_abort"}
MODEL = SimulatedModel(DEFAULT_SEED).name


def trm(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`trm demo ARGS` in `cwd`, with no inherited TRM_*/LLM_* settings."""
    return subprocess.run(
        [*TRM, "demo", *args],
        cwd=cwd,
        env=child_env(cwd),
        capture_output=True,
        text=True,
        timeout=240,
    )


def cached_units(store: Store, snapshot: str) -> set[str]:
    return {
        e.data["unit_id"]
        for e in store.read_stream(f"baseline:{snapshot}")
        if e.type == "baseline.unit_cached"
    }


def check_first_epoch(store: Store, data: dict[str, Any]) -> None:
    assert data["verdict"] in VERDICTS
    (gate,) = list_gates(store)
    assert (gate["gate_id"], gate["verdict"]) == (data["gate_id"], data["verdict"])
    types = [e.type for e in store.read_stream(f"gate:{gate['gate_id']}")]
    assert types[0] == "gate.started" and types[-1] == "gate.decided"
    assert types.count("gate.block_evaluated") == len(data["blocks"]) >= 1
    for arm in data["arms"].values():
        info = run_info(store, arm["run_id"])
        assert info["status"] == "completed"
        assert info["predictions"] == arm["questions_asked"] > 0
    runs = [r["run_id"] for r in get_manifest(store, "trm-demo")["runs"]]
    assert runs == [data["arms"]["baseline"]["run_id"], data["arms"]["candidate"]["run_id"]]
    assert data["endpoint"]["simulated"] and data["endpoint"]["model"] == MODEL
    # Governance was exercised, and what the summary says is what the events hold.
    stats = llm_stats(store)[MODEL]
    assert stats["calls"] == data["calls"]["total"] > 0
    assert stats["attempt_reasons"] == data["calls"]["failed_attempts_by_reason"]
    assert stats["attempt_reasons"].get("truncated_no_done", 0) > 0
    assert data["calls"]["retries"] > 0 and data["breaker_transitions"]
    # No injected fault got through as an answer: each one is a failed attempt in the events
    # (a loaded machine may add a stall of its own, hence >=).
    assert sum(stats["attempt_reasons"].values()) >= sum(data["faults_injected"].values()) > 0
    for name, arm in data["arms"].items():
        infra = sum(v for k, v in arm["stop_reasons"].items() if k in ("error", "parse_error"))
        assert data["infra_units"][name] <= infra
    assert store.verify_projections() == []


@pytest.mark.slow
def test_two_epochs_reuse_the_baseline_cache(tmp_path: Path) -> None:
    """On the embedded defaults: ./trm.db and the response cache ./trm-cache.db."""
    url = f"sqlite:///{tmp_path / 'trm.db'}"
    first = trm("--json", cwd=tmp_path)
    assert first.returncode in (0, 1), first.stderr
    data = json.loads(first.stdout)
    snapshot = data["baseline_cache"]["snapshot"]
    with open_store(url) as store:
        check_first_epoch(store, data)
        after_first = cached_units(store, snapshot)
    assert data["baseline_cache"]["hits"] == 0
    assert len(after_first) == data["baseline_cache"]["cached_now"] > 0
    assert (tmp_path / "trm-cache.db").exists()

    second = trm(cwd=tmp_path)
    assert second.returncode in (0, 1), second.stderr
    out = second.stdout
    assert "SIMULATED" in out and "epoch 2" in out
    reuse = re.search(r"(\d+) of (\d+) units from the baseline cache", out)
    assert reuse is not None and int(reuse[1]) > 0, out
    with open_store(url) as store:
        gate = list_gates(store)[0]
        assert gate["verdict"] in VERDICTS and gate["baseline_cache_hits"] == int(reuse[1])
        assert f"trm gate-report {gate['gate_id']} --db" in out
        assert f"trm replay-projections --verify --db {store.url}" in out
        base_run, cand_run = (f"{gate['gate_id']}-{arm}" for arm in ("baseline", "candidate"))
        # No baseline unit cached by the first epoch was evaluated again; those that were
        # (INFRA then, so never cached) replayed every answer that had completed (same salt);
        # units the first epoch never reached (it stopped sooner) were asked afresh.
        asked = read_predictions(store, base_run)
        assert asked and not {p["unit_id"] for p in asked} & after_first
        before = {
            p["question_id"]: p["stop_reason"]
            for p in read_predictions(store, data["arms"]["baseline"]["run_id"])
        }
        assert [p.get("cached", False) for p in asked] == [
            before.get(p["question_id"], "error") != "error" for p in asked
        ]
        # ... while the candidate was sampled afresh: its new salt never hit the cache.
        salt = run_info(store, cand_run)["config"]["cache_salt"]
        assert salt != data["arms"]["candidate"]["cache_salt"]
        calls = [c for c in llm_calls(store, source=MODEL) if c["cache_salt"] == salt]
        assert calls and not any(c["cache_hit"] for c in calls)
        assert store.verify_projections() == []


@pytest.mark.slow
def test_a_real_endpoint_by_base_url(tmp_path: Path) -> None:
    """Any OpenAI-compatible server: here the simulated model again, with no faults."""
    quiet = FaultPlan(seed=0, epoch=1, rates=(), sticky_rate=0.0, outage_after=10**9)
    server = DemoServer(SimulatedModel(DEFAULT_SEED), quiet, stall_s=1.0)
    stop = server.run_in_thread()
    try:
        url = f"sqlite:///{tmp_path / 'trm.db'}"
        done = trm(
            "--db", url, "--base-url", server.base_url, "--model", MODEL, "--json", cwd=tmp_path
        )
    finally:
        stop()
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["verdict"] in VERDICTS - {"infra_abort"}
    assert data["endpoint"] == {
        "base_url": server.base_url,
        "model": MODEL,
        "simulated": False,
        "served_at": None,
    }
    assert data["faults_injected"] is None and data["calls"]["retries"] == 0
    assert data["baseline_cache"]["snapshot"].startswith(f"{MODEL}|ep-")
    assert server.request_count == data["calls"]["total"] > 0


@pytest.mark.slow
def test_an_unreachable_endpoint_ends_in_infra_abort(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'trm.db'}"
    dead = "http://127.0.0.1:9/v1"  # the discard port: nothing listens
    done = trm("--db", url, "--base-url", dead, "--model", "m", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    data = json.loads(done.stdout)
    assert data["verdict"] == "infra_abort"
    assert data["infra_units"]["baseline"] > 0 and data["infra_units"]["candidate"] > 0
    assert data["calls"]["completed"] == 0
    cause = data["infra_cause"]  # issue 17: the cause and the last error, not counts only
    assert cause["kind"] == "unreachable" and "ConnectError" in cause["last_error"]
    assert "--base-url" in cause["try"]
    assert data["baseline_cache"]["cached_now"] == 0  # nothing INFRA is ever cached
    with open_store(url) as store:
        assert cached_units(store, data["baseline_cache"]["snapshot"]) == set()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--base-url", "http://127.0.0.1:8000/v1"], "--base-url and --model go together"),
        (["--model", "m"], "--base-url and --model go together"),
        (["--base-url", "ftp://host/v1", "--model", "m"], "must be an http(s) URL"),
        (["--base-url", "http://[::1/v1", "--model", "m"], "must be an http(s) URL"),
        (["--base-url", "http://h/v1", "--model", " "], "--model must not be blank"),
    ],
)
def test_bad_arguments_exit_2_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    db = tmp_path / "trm.db"
    assert cli.main(["demo", "--db", f"sqlite:///{db}", *args]) == 2
    assert message in capsys.readouterr().err
    assert not db.exists() and not (tmp_path / "trm-cache.db").exists()


@pytest.mark.parametrize("args", [["--seed", "-1"], ["--seed", "x"], ["--concurrency", "0"]])
def test_bad_numbers_are_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", *args])
    assert exit_.value.code == 2
    assert "error: argument" in capsys.readouterr().err


def test_the_gates_infra_reasons_from_the_environment_reach_its_arms(tmp_path: Path) -> None:
    """With `TRM_GATE_INFRA_REASONS='["error"]'` (unreadable replies scored as wrong answers),
    the demo's arms score them so: the gate decides instead of dying on results its policy
    calls inconsistent; the run log keeps each question's own outcome."""
    url = f"sqlite:///{tmp_path / 'trm.db'}"
    done = subprocess.run(
        [*TRM, "demo", "--db", url, "--json"],
        cwd=tmp_path,
        env=child_env(tmp_path, TRM_GATE_INFRA_REASONS='["error"]'),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode in (0, 1), done.stderr
    data = json.loads(done.stdout)
    with open_store(url) as store:
        check_first_epoch(store, data)
        (started, *_) = store.read_stream(f"gate:{data['gate_id']}")
        assert started.data["config"]["infra_reasons"] == ["error"]
        unread = [
            p
            for arm in data["arms"].values()
            for p in read_predictions(store, arm["run_id"])
            if p["stop_reason"] == "parse_error"
        ]
        assert all(p["correct"] is None for p in unread)
