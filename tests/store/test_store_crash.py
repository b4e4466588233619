"""SIGKILL a writer at random moments: nothing acknowledged is lost, projections recover."""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.store.helpers import TOTALS, replayed_totals, totals
from trm_store import open_store

ROOT = Path(__file__).resolve().parents[2]
KILLS = 20


def _run_and_kill(url: str, rng: random.Random) -> dict[int, str]:
    """Start a writer, let it acknowledge some appends, SIGKILL it; return what it acknowledged."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.store.workers", "crash", url, "7"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    acknowledged: dict[int, str] = {}
    # Wait until it is writing, then kill it after a random extra delay (mid-append or mid-rebuild).
    line = child.stdout.readline()
    assert line, child.stderr.read() if child.stderr else "writer exited early"
    time.sleep(rng.uniform(0.0, 0.3))
    child.send_signal(signal.SIGKILL)
    rest, err = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL, err
    # Only a complete line is an acknowledgement: the kill may land in the middle of printing one.
    for entry in (line + rest).splitlines(keepends=True):
        if entry.endswith("\n"):
            position, event_id = entry.split()
            acknowledged[int(position)] = event_id
    return acknowledged


@pytest.mark.slow
def test_sigkill_mid_write_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    url = f"sqlite:///{path}"
    rng = random.Random(20261129)
    acknowledged: dict[int, str] = {}
    for _ in range(KILLS):
        acknowledged.update(_run_and_kill(url, rng))
        with sqlite3.connect(path) as raw:
            assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        with open_store(url, projections=TOTALS) as store:
            stored = {e.position: e.event_id for e in store.read_all()}
            assert {p: stored.get(p) for p in acknowledged} == acknowledged
            assert sorted(stored) == list(range(1, len(stored) + 1))
            assert store.verify_projections() == []
            assert totals(store) == replayed_totals(store)
    assert len(acknowledged) > KILLS
