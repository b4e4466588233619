"""`trm demo --resume` (issue 17 point 6): a demo killed mid-gate continues its gate, keeping
the recorded blocks; a gate that decided is refused with exit 2 and nothing written."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli.helpers import child_env
from tests.demo.test_demo_cli import TRM, VERDICTS, trm
from trm_store import open_store
from trm_store.domain.gates import RESUMED, gate_blocks, gate_info, gate_stream, list_gates


def blocks(url: str) -> tuple[str | None, int]:
    with open_store(url) as store:
        gates = list_gates(store)
        if not gates:
            return None, 0
        return gates[0]["gate_id"], len(gate_blocks(store, gates[0]["gate_id"]))


@pytest.mark.slow
def test_a_killed_demo_resumes_its_gate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'trm.db'}"
    child = subprocess.Popen(
        [*TRM, "demo", "--json"],
        cwd=tmp_path,
        env=child_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while blocks(url)[1] < 1:
            assert child.poll() is None, "the demo ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.2)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    gate_id, before = blocks(url)
    with open_store(url) as store:
        assert gate_id is not None and gate_info(store, gate_id)["status"] == "running"
    resumed = trm("--resume", "--json", cwd=tmp_path)
    assert resumed.returncode in (0, 1), resumed.stderr
    data = json.loads(resumed.stdout)
    assert data["gate_id"] == gate_id and data["verdict"] in VERDICTS
    with open_store(url) as store:
        info = gate_info(store, gate_id)
        assert info["status"] == "decided" and info["blocks"] >= before
        types = [e.type for e in store.read_stream(gate_stream(gate_id))]
        assert types.count(RESUMED) == 1 and types.count("gate.started") == 1
        assert data["arms"]["candidate"]["run_id"] == f"{gate_id}-candidate-r1"
        head = store.head_position()
    again = trm("--resume", cwd=tmp_path)
    assert again.returncode == 2 and "decided already" in again.stderr
    with open_store(url) as store:
        assert store.head_position() == head  # nothing written
