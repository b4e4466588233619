"""`Gate.resume`'s take-over: rebuild an interrupted gate's state from its own events.

The gate's `gate.started` gives the seed (so the same unit order) and the parameters; each
`gate.block_evaluated` carries its block's pairing (the deltas and the INFRA units' scores), so
folding `step` over them rebuilds the exact `GateState`, e-processes and INFRA guard included,
and each replayed block must land on the e-values and decision it recorded. The e-processes are
nonnegative supermartingales whatever the stopping rule, so continuing after a crash (or not)
keeps every guarantee: the resumed gate is the same sequential test, looked at once more.

Take-over (`trm_store.domain.gate_leases.takeover_problem`): allowed for a gate that failed or
whose holder is gone; refused for one that decided or that a live process may still run. The
`gate.resumed` event is appended at the version the replay read, which moves the lease to this
process and fences the old holder off (its next append expects an older version and fails).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from trm_gate.config import GateConfig
from trm_gate.errors import GateInputError, GateNotResumableError
from trm_gate.pairing import BlockPairing
from trm_gate.step import GateState, step
from trm_store import ConcurrencyError, NewEvent, Store
from trm_store.domain.errors import UnknownGateError
from trm_store.domain.gate_leases import takeover_problem
from trm_store.domain.gates import BLOCK_EVALUATED, RESUMED, gate_stream

__all__ = ["Resumed", "pool_digest", "take_over"]


def pool_digest(pool: Sequence[str]) -> str:
    """What `gate.started` records of the pool: its units in the order given (the seed's shuffle
    of that order is the gate's unit order), as a sha256 of their JSON list."""
    return hashlib.sha256(json.dumps(list(pool)).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Resumed:
    """An interrupted gate taken over: its seed and unit order, the state after its recorded
    blocks (`state.blocks` of them), and the stream version after `gate.resumed`."""

    seed: int
    order: list[str]
    state: GateState
    at: int


def take_over(
    store: Store,
    gate_id: str,
    config: GateConfig,
    pool: Sequence[str],
    snapshots: tuple[str, str],
    *,
    older_than: timedelta | None,
) -> Resumed:
    """Check, replay and take over `gate_id` (see the module docstring)."""
    stream = gate_stream(gate_id)
    try:
        problem, version, taken_from = takeover_problem(store, gate_id, older_than=older_than)
    except UnknownGateError:
        raise GateNotResumableError(f"no gate {gate_id!r} was started") from None
    if problem is not None:
        raise GateNotResumableError(f"gate {gate_id!r} cannot be resumed: {problem}")
    events = [e for e in store.read_stream(stream) if e.version <= version]
    started = events[0].data
    _check_same(gate_id, started, config, pool, snapshots)
    order = list(pool)
    random.Random(started["seed"]).shuffle(order)
    size = config.block_size
    total = -(-len(order) // size)
    state = GateState(config)
    for event in events:
        if event.type == BLOCK_EVALUATED:
            state = _replay(gate_id, state, event.data, order, size, total)
    try:
        recorded = store.append(
            stream,
            [NewEvent(RESUMED, {"after_block": state.blocks, "taken_from": taken_from})],
            expected_version=version,
        )
    except ConcurrencyError:
        raise GateNotResumableError(
            f"gate {gate_id!r} moved while it was being resumed (another process wrote to it)"
        ) from None
    return Resumed(started["seed"], order, state, recorded[-1].version)


def _check_same(
    gate_id: str,
    started: Mapping[str, Any],
    config: GateConfig,
    pool: Sequence[str],
    snapshots: tuple[str, str],
) -> None:
    """The resumed gate must be the one that started: same arms, parameters and pool."""
    recorded = (started["baseline_snapshot"], started["candidate_snapshot"])
    if recorded != snapshots:
        raise GateInputError(
            f"gate {gate_id!r} was started with snapshots {recorded}, not {snapshots}"
        )
    if started["config"] != config.to_record():
        raise GateInputError(
            f"gate {gate_id!r} was started with other parameters: {started['config']}; build "
            "the Gate with those (e.g. the same GateSettings)"
        )
    if started["pool_size"] != len(pool):
        raise GateInputError(
            f"gate {gate_id!r} was started on {started['pool_size']} units, not {len(pool)}"
        )
    if started.get("pool_digest") not in (None, pool_digest(pool)):
        raise GateInputError(
            f"gate {gate_id!r} was started on other units, or on these in another order: give "
            "the pool it started on, in the same order"
        )


def _replay(
    gate_id: str,
    state: GateState,
    data: Mapping[str, Any],
    order: list[str],
    size: int,
    total: int,
) -> GateState:
    index = state.blocks + 1
    if data["unit_ids"] != order[(index - 1) * size : index * size]:
        raise GateInputError(
            f"gate {gate_id!r}: block {index} holds other units than this pool gives it (the "
            "pool must be the one the gate started on, in the same order)"
        )
    if data.get("deltas") is None or data.get("infra_scores") is None:
        raise GateNotResumableError(
            f"gate {gate_id!r}: block {index} was recorded without its pairing (by an older "
            "trm), so it cannot be replayed"
        )
    pairing = BlockPairing(
        units=len(data["unit_ids"]),
        deltas=tuple(data["deltas"]),
        infra_baseline=len(data["infra_baseline"]),
        infra_candidate=len(data["infra_candidate"]),
        baseline_cache_hits=data["baseline_cache_hits"],
        infra_scores=tuple((b, c) for b, c in data["infra_scores"]),
    )
    state, decision = step(state, pairing, final=index == total)
    replayed = (state.log_e_value, state.log_futility_e_value, decision.verdict)
    if replayed != (data["log_e_value"], data["log_futility_e_value"], data["decision"]):
        raise GateNotResumableError(
            f"gate {gate_id!r}: block {index} replays to {replayed}, not to what it recorded"
        )
    if decision.final:
        raise GateNotResumableError(f"gate {gate_id!r}: block {index} ended it already")
    return state
