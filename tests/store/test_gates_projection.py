"""The `gates` projection and the gate event models: rows follow the events, a rebuild equals the
live table, bad event data is refused before anything is written."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from trm_store import EventValidationError, NewEvent, Store, open_store
from trm_store.domain.errors import UnknownGateError
from trm_store.domain.gates import (
    BLOCK_EVALUATED,
    DECIDED,
    STARTED,
    gate_blocks,
    gate_info,
    gate_stream,
    list_gates,
)

CONFIG = {"alpha": 0.05, "beta": 0.2, "p1": 0.6, "block_size": 2}


def started(seed: int = 7) -> NewEvent:
    return NewEvent(
        STARTED,
        {
            "baseline_snapshot": "b@1",
            "candidate_snapshot": "c@1",
            "seed": seed,
            "pool_size": 4,
            "config": CONFIG,
        },
    )


def block(n: int, unit_ids: list[str], **overrides: object) -> NewEvent:
    data: dict[str, object] = {
        "block": n,
        "unit_ids": unit_ids,
        "wins": 1,
        "losses": 0,
        "ties": 0,
        "infra_baseline": unit_ids[-1:],
        "infra_candidate": [],
        "baseline_cache_hits": 1,
        "log_e_value": 0.25 * n,
        "log_futility_e_value": -0.1 * n,
        "decision": "continue",
    }
    data.update(overrides)
    return NewEvent(BLOCK_EVALUATED, data)


def decided(**overrides: object) -> NewEvent:
    data: dict[str, object] = {
        "verdict": "inconclusive",
        "reason": "unit pool exhausted",
        "blocks": 2,
        "units_evaluated": 4,
        "wins": 2,
        "losses": 0,
        "ties": 0,
        "infra_units_baseline": 2,
        "infra_units_candidate": 0,
        "baseline_cache_hits": 2,
        "log_e_value": 0.5,
        "log_futility_e_value": -0.2,
    }
    data.update(overrides)
    return NewEvent(DECIDED, data)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as s:
        yield s


def test_projection_follows_the_events(store: Store) -> None:
    stream = gate_stream("g1")
    store.append(stream, [started()], expected_version=0)
    info = gate_info(store, "g1")
    assert info["status"] == "running" and info["verdict"] is None and info["blocks"] == 0
    assert info["config"] == CONFIG and info["seed"] == 7
    store.append(stream, [block(1, ["a", "b"])])
    store.append(stream, [block(2, ["c", "d"], decision="inconclusive"), decided()])
    info = gate_info(store, "g1")
    assert info["status"] == "decided" and info["verdict"] == "inconclusive"
    assert (info["blocks"], info["units_evaluated"], info["wins"]) == (2, 4, 2)
    assert (info["infra_units_baseline"], info["baseline_cache_hits"]) == (2, 2)
    assert info["log_e_value"] == pytest.approx(0.5)
    assert info["decided_at"] is not None and info["started_at"] <= info["decided_at"]
    assert [b["block"] for b in gate_blocks(store, "g1")] == [1, 2]


def test_rebuild_equals_the_live_table(store: Store) -> None:
    for i in range(3):
        stream = gate_stream(f"g{i}")
        store.append(stream, [started(seed=i), block(1, ["a", "b"])])
        if i != 1:
            store.append(stream, [decided()])
    before = {g["gate_id"]: g for g in list_gates(store)}
    assert store.rebuild_projections(only=["gates"]) == {"gates": 8}
    assert {g["gate_id"]: g for g in list_gates(store)} == before
    assert store.verify_projections() == []
    assert before["g1"]["status"] == "running" and before["g2"]["status"] == "decided"


@pytest.mark.parametrize(
    "event",
    [
        block(1, ["a"], log_e_value=math.nan),
        block(1, ["a"], log_e_value=math.inf),
        block(1, [], infra_baseline=[]),
        block(0, ["a"]),
        block(1, ["a"], decision="maybe"),
        block(1, ["a"], wins=-1),
        decided(verdict="accepted"),
        decided(wins=True),
        NewEvent(
            STARTED,
            {
                "baseline_snapshot": "",
                "candidate_snapshot": "c",
                "seed": 1,
                "pool_size": 1,
                "config": {},
            },
        ),
        NewEvent(
            STARTED,
            {
                "baseline_snapshot": "b",
                "candidate_snapshot": "c",
                "seed": -1,
                "pool_size": 1,
                "config": {},
            },
        ),
    ],
)
def test_bad_gate_events_are_refused_and_nothing_is_written(store: Store, event: NewEvent) -> None:
    with pytest.raises(EventValidationError):
        store.append(gate_stream("g"), [event])
    assert store.head_position() == 0


def test_unknown_gate(store: Store) -> None:
    with pytest.raises(UnknownGateError):
        gate_info(store, "nope")
    with pytest.raises(UnknownGateError):
        gate_blocks(store, "nope")
    assert list_gates(store) == []
