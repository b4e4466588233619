"""`trm diagnose` survives poison (issue 15.9): an answer holding a NUL or a split surrogate is
recorded as `uncertain` with the reason (`detail.parse` = `poison`), the job goes on, and a rerun
(the answer now from the cache) does not die at it either; Ctrl-C exits 130 with one line."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.helpers import TierServer, child_env, trm, trm_command, write_items
from trm_llm.simulated_server import Reply, normal
from trm_store import open_store
from trm_store.domain.diagnosis import read_diagnoses

POISON = {"nul": "correct\x00wrong", "surrogate": "correct \ud83d"}


class PoisonServer(TierServer):
    """A TierServer whose `[[say:nul]]` / `[[say:surrogate]]` answers are poison."""

    def respond(self, body: Any) -> Reply:
        reply = super().respond(body)
        prompt = body["messages"][-1]["content"]
        for marker, answer in POISON.items():
            if f"[[say:{marker}]]" in prompt:
                poisoned = normal([answer])
                return Reply(poisoned.status, poisoned.headers, poisoned.steps, poisoned.ending)
        return reply


@pytest.fixture
def server() -> Iterator[PoisonServer]:
    srv = PoisonServer()
    stop = srv.run_in_thread()
    yield srv
    stop()


def _items(tmp_path: Path) -> Path:
    hints = ["correct", "nul", "wrong", "surrogate", "correct"]
    items = [{"question_id": f"q{i}", "hint": f"[[say:{h}]]"} for i, h in enumerate(hints)]
    return write_items(tmp_path / "items.jsonl", items)


def _diagnose(server: PoisonServer, url: str, tmp_path: Path, *extra: str) -> Any:
    args = ["diagnose", "--run-id", "r1", "--items", str(_items(tmp_path)), "--db", url]
    args += ["--base-url", server.base_url, "--model", "sim", "--json", "--concurrency", "1"]
    done = trm(*args, *extra, cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_a_nul_answer_is_recorded_as_poison_and_the_job_goes_on(
    store_url: str, tmp_path: Path, server: PoisonServer
) -> None:
    first = _diagnose(server, store_url, tmp_path)
    summary = json.loads(first.stdout)
    assert summary["poison"]["NUL"] == 1
    # q0 and q4, and q3 (its lone surrogate repaired by trm_llm); q2 is wrong
    assert summary["tiers"]["correct"] == 3 and summary["tiers"]["wrong"] == 1
    with open_store(store_url, read_only=True) as store:
        diagnoses = read_diagnoses(store, "r1")
    detail = diagnoses["q1"]["detail"]
    assert (diagnoses["q1"]["tier"], detail["parse"], detail["poison"]) == (
        "uncertain",
        "poison",
        "NUL",
    )
    assert detail["answer"] == "correct\ufffdwrong"
    # A rerun does not die at it (its answer, in the cache, is never asked for again: the item
    # is done); --retry-uncertain asks afresh and records whatever comes back.
    rerun = _diagnose(server, store_url, tmp_path)
    assert json.loads(rerun.stdout)["skipped_done"] >= 4
    assert sum("[[say:nul]]" in p for p in server.prompts()) == 1
    retry = _diagnose(server, store_url, tmp_path, "--retry-uncertain")
    assert json.loads(retry.stdout)["poison"]["NUL"] == 1


def test_a_lone_surrogate_is_repaired_before_the_job_sees_it(
    store_url: str, tmp_path: Path, server: PoisonServer
) -> None:
    """trm_llm replaces a lone UTF-16 half by U+FFFD (issue 15.5), so that item is diagnosed from
    the repaired answer like any other and no item fails; the job's own poison check stays for
    clients that return such text."""
    first = _diagnose(server, store_url, tmp_path)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert summary["diagnosed"] == 5 and sum(summary["failed"].values()) == 0
    with open_store(store_url, read_only=True) as store:
        diagnoses = read_diagnoses(store, "r1")
    assert diagnoses["q3"]["tier"] == "correct"


@pytest.fixture
def sigint_handled() -> Iterator[None]:
    """SIGINT handled in this process for the test's length, so a child it starts gets it at its
    default and its interpreter turns it into KeyboardInterrupt. pytest started in the background
    by a non-interactive shell runs with SIGINT ignored, which a child inherits (a handler does
    not survive exec, an ignored signal does): the child then never saw the test's Ctrl-C."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("sigint_handled")
def test_ctrl_c_exits_130_with_one_line(store_url: str, tmp_path: Path) -> None:
    slow = TierServer(delay_s=30)
    stop = slow.run_in_thread()
    try:
        args = ["diagnose", "--run-id", "r1", "--items", str(_items(tmp_path)), "--db", store_url]
        child = subprocess.Popen(
            trm_command(*args, "--base-url", slow.base_url, "--model", "sim"),
            cwd=tmp_path,
            env=child_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert slow.wait_for_requests(1, timeout_s=60)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        stop()
    assert child.returncode == 130
    lines = [line for line in err.splitlines() if line.strip() and "diagnosing" not in line]
    assert lines == ["trm diagnose: interrupted (what was recorded is kept; run again)"], err
