"""`trm demo --base-url` against servers that behave like real local ones (issue 17): one that
serves a single request at a time and cuts the streams in flight when more arrive (llama.cpp's
server with one slot), and a model whose replies the grader cannot read. The demo runs at its
defaults; what it reports must name what really happened."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.demo.test_demo_cli import MODEL, trm
from trm_llm.simulated_server import Reply, normal
from trm_store.cli.demo import DEFAULT_SEED
from trm_store.cli.demo.faults import FaultPlan
from trm_store.cli.demo.model import SimulatedModel
from trm_store.cli.demo.server import DemoServer

QUIET = FaultPlan(seed=0, epoch=1, rates=(), sticky_rate=0.0, outage_after=10**9)


class OneSlotServer(DemoServer):
    """The simulated model, its tokens paced as a real model's are, one request at a time:
    a second request cuts every stream in flight."""

    def __init__(self) -> None:
        super().__init__(SimulatedModel(DEFAULT_SEED), QUIET, stall_s=1.0)
        self.max_in_flight = 1

    def respond(self, body: Any) -> Reply:
        reply = super().respond(body)
        steps = [s for step in reply.steps for s in (0.002, step)]
        return Reply(reply.status, reply.headers, tuple(steps), reply.ending)


class UnreadableServer(DemoServer):
    """Answers every question, always a ramble with no answer the grader can read."""

    def __init__(self) -> None:
        super().__init__(SimulatedModel(DEFAULT_SEED), QUIET, stall_s=1.0)

    def respond(self, body: Any) -> Reply:
        return normal(["Let me think about it.\n", "It is hard to say what the answer is here."])


@pytest.mark.slow
def test_a_server_with_one_slot_decides_at_the_default_concurrency(tmp_path: Path) -> None:
    """Before the limiter: the breaker opened on the cut streams and the gate ended infra_abort."""
    server = OneSlotServer()
    stop = server.run_in_thread()
    try:
        url = f"sqlite:///{tmp_path / 'trm.db'}"
        done = trm(
            "--db", url, "--base-url", server.base_url, "--model", MODEL, "--json", cwd=tmp_path
        )
    finally:
        stop()
    data = json.loads(done.stdout)
    assert data["verdict"] != "infra_abort", data["reason"]
    assert done.returncode == 0, done.stderr
    assert data["calls"]["failed"] == 0 and data["breaker_transitions"] == []
    assert server.overloaded > 0  # the demo's 8 at once did overload it, and it learnt
    limit = data["concurrency_limit"]
    assert limit["path"][0] == 4 and limit["min"] == 1 and limit["shrank"] >= 1
    assert data["calls"]["overload_retries"] >= 1
    tokens = data["tokens"]
    assert set(tokens["arms"]) == {"baseline", "candidate"}
    assert tokens["gate"]["total"] == sum(t["total"] for t in tokens["arms"].values()) > 0


@pytest.mark.slow
def test_unreadable_replies_are_named_as_the_cause_not_the_endpoint(tmp_path: Path) -> None:
    server = UnreadableServer()
    stop = server.run_in_thread()
    try:
        url = f"sqlite:///{tmp_path / 'trm.db'}"
        done = trm("--db", url, "--base-url", server.base_url, "--model", "smol", cwd=tmp_path)
    finally:
        stop()
    assert done.returncode == 1, done.stderr
    out = " ".join(done.stdout.split())  # the report wraps long lines
    assert "INFRA_ABORT" in out
    assert "unreadable:" in out and "replies could not be graded" in out
    assert "the endpoint failed too often" not in out
    assert "try" in out and "a prompt that states the format" in out
