"""Recorded strings are shown as text by every `trm` table: an id or reason holding rich markup
(`[/]` would make rich raise MarkupError, `[red]` would restyle the report) prints verbatim."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.cli.helpers import trm
from tests.gate.test_gate_report import run_gate
from trm_llm import GovernedLLMClient, RetryPolicy, StoreEventSink
from trm_llm.simulated_server import SimulatedServer, normal, status
from trm_store import RunLog, open_store
from trm_store.domain.run_leases import fail_run

MARKUP = "x[/]y[bold red]z"


async def _no_sleep(seconds: float) -> None:
    return None


async def _one_call(url: str) -> None:
    """One call that fails once (a 500), then completes: `trm llm-stats` prints the source's
    failed attempts on a line of its own, under its table (where a long cell would wrap)."""
    with open_store(url) as store:
        async with SimulatedServer() as server:
            server.script(status(500), normal())
            async with GovernedLLMClient(
                server.base_url,
                "sim",
                source=MARKUP,
                sink=StoreEventSink(store),
                retry=RetryPolicy(max_attempts=3),
                sleep=_no_sleep,
            ) as client:
                await client.chat([{"role": "user", "content": "hi"}])


@pytest.fixture
def hostile_store(sqlite_url: str) -> str:
    with open_store(sqlite_url) as store, RunLog(store, f"run-{MARKUP}") as log:
        log.record_prediction("q", unit_id="u", prediction="p", correct=True, stop_reason="stop")
    with open_store(sqlite_url) as store:
        RunLog(store, f"open-{MARKUP}").__enter__()
        fail_run(store, f"open-{MARKUP}", reason=MARKUP)
    run_gate(sqlite_url, gate_id=f"gate-{MARKUP}")
    asyncio.run(_one_call(sqlite_url))
    return sqlite_url


@pytest.mark.parametrize(
    "command",
    [
        ("runs",),
        ("gates",),
        ("gate-report", f"gate-{MARKUP}"),
        ("llm-stats",),
        ("predictions", f"run-{MARKUP}"),
    ],
)
def test_markup_in_recorded_strings_prints_verbatim(
    hostile_store: str, tmp_path: Path, command: tuple[str, ...]
) -> None:
    done = trm(*command, "--db", hostile_store, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert MARKUP in done.stdout
