"""Gates do not stay `running` forever (issue 14.9): a gate's lease is derived from its own events
(holder from the started event's meta, heartbeat from its last event); `mark_stale_gates` fails
the gates whose process on this host is gone at once, the silent ones after the threshold, once
each; `trm gates` lists them with status, verdict and age. Both backends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.cli.helpers import trm
from tests.store.helpers import die_in_a_child
from tests.store.test_gates_projection import block, decided, started
from trm_store import Store, mark_stale_gates, open_store
from trm_store.domain.gate_leases import stale_gates
from trm_store.domain.gates import gate_info, gate_stream

LATER = datetime.now(UTC) + timedelta(days=2)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as s:
        yield s


def _start_in_a_child_that_dies(url: str, gate_id: str) -> None:
    """A child starts the gate (the store records its host and pid), evaluates a block and
    exits without deciding, as a killed gate would."""
    die_in_a_child(
        url,
        gate_id,
        "from tests.store.test_gates_projection import block, started\n"
        "store.append('gate:' + sys.argv[2], [started()])\n"
        "store.append('gate:' + sys.argv[2], [block(1, ['u1', 'u2'])])\n",
    )


def test_a_gate_whose_process_is_gone_is_failed_at_once_and_once(store: Store) -> None:
    _start_in_a_child_that_dies(store.url, "orphan")
    store.append(gate_stream("alive"), [started()])  # started by this process: alive
    store.append(gate_stream("done"), [started(), block(1, ["u1", "u2"]), decided(blocks=1)])
    assert [g.gate_id for g in stale_gates(store, timedelta(days=365))] == ["orphan"]
    assert mark_stale_gates(store, timedelta(days=365)) == ["orphan"]
    assert mark_stale_gates(store, timedelta(days=365)) == []  # idempotent
    info = gate_info(store, "orphan")
    assert (info["status"], info["blocks"]) == ("failed", 1)
    assert "is gone" in info["reason"]
    failed = store.read_stream(gate_stream("orphan"))[-1]
    assert (failed.type, failed.data["reason"], failed.data["block"]) == ("gate.failed", "stale", 2)
    assert gate_info(store, "alive")["status"] == "running"
    assert gate_info(store, "done")["status"] == "decided"
    assert store.verify_projections() == []


def test_a_gate_without_a_holder_goes_stale_by_age_alone(store: Store) -> None:
    elsewhere = {"host": "another-host", "pid": 1}  # its pid cannot be checked from here
    store.append(gate_stream("g"), [replace(started(), meta=elsewhere)])
    assert gate_info(store, "g")["host"] == "another-host"
    assert mark_stale_gates(store, timedelta(hours=1)) == []
    store.append(gate_stream("g"), [block(1, ["u1", "u2"])])
    last = gate_info(store, "g")["last_event_at"]
    assert stale_gates(store, timedelta(hours=1), now=last + timedelta(minutes=59)) == []
    assert mark_stale_gates(store, timedelta(hours=1), now=LATER) == ["g"]
    assert gate_info(store, "g")["status"] == "failed"


def test_trm_gates_lists_status_verdict_and_age(store_url: str, tmp_path: Path) -> None:
    with open_store(store_url) as store:
        store.append(gate_stream("done"), [started(), block(1, ["u1", "u2"]), decided(blocks=1)])
    _start_in_a_child_that_dies(store_url, "orphan")
    with open_store(store_url) as store:
        head = store.head_position()

    listed = trm("gates", "--db", store_url, "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    gates = {g["gate_id"]: g for g in report["gates"]}
    assert {k: (g["status"], g["verdict"]) for k, g in gates.items()} == {
        "done": ("decided", "inconclusive"),
        "orphan": ("running", None),
    }
    assert all(g["age_s"] >= 0 for g in gates.values())
    assert datetime.fromisoformat(gates["done"]["decided_at"]).utcoffset() == timedelta(0)
    assert (report["stale"], report["marked_stale"]) == (["orphan"], [])
    with open_store(store_url, read_only=True) as store:
        assert store.head_position() == head  # listing writes nothing

    table = trm("gates", "--db", store_url, cwd=tmp_path)
    assert table.returncode == 0 and "STALE" in table.stdout and "inconclusive" in table.stdout
    marked = json.loads(
        trm("gates", "--db", store_url, "--json", "--mark-stale", cwd=tmp_path).stdout
    )
    assert marked["marked_stale"] == ["orphan"] and marked["stale"] == []
    assert {g["gate_id"]: g["status"] for g in marked["gates"]}["orphan"] == "failed"
