"""`Gate.resume` (issue 17 point 6): an interrupted gate continues from its own events with the
same seed and unit order, and ends with the verdict and W/L of an uninterrupted run; it takes
over only a gate whose holder is gone or that failed, never a decided one or a live one."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.gate import resume_worker as worker
from tests.gate.arms import OK, WRONG, TableArm, table, units
from trm_gate import (
    Arm,
    Gate,
    GateInputError,
    GateNotResumableError,
    GateProgress,
    GateResult,
    GateStateError,
    QuestionResult,
)
from trm_store import Store, open_store
from trm_store.domain.gates import RESUMED, gate_blocks, gate_info, gate_stream

ROOT = Path(__file__).resolve().parents[2]
OUTCOME = ("verdict", "wins", "losses", "ties", "e_value", "futility_e_value", "units_evaluated")


def same_outcome(a: GateResult, b: GateResult) -> None:
    assert {k: getattr(a, k) for k in OUTCOME} == {k: getattr(b, k) for k in OUTCOME}
    assert a.blocks == b.blocks and a.seed == b.seed


async def uninterrupted(url: str) -> GateResult:
    with open_store(url) as store:
        baseline, candidate = worker.arms()
        return await worker.gate(store).run(
            "ref", worker.POOL, baseline=baseline, candidate=candidate, seed=worker.SEED
        )


def blocks_on_record(url: str, gate_id: str) -> int:
    with open_store(url) as store:
        try:
            return len(gate_blocks(store, gate_id))
        except Exception:  # not started yet
            return 0


async def test_a_gate_killed_mid_run_resumes_to_the_uninterrupted_verdict(tmp_path: Path) -> None:
    reference = await uninterrupted(f"sqlite:///{tmp_path / 'ref.db'}")
    assert reference.blocks > 4, "the outcomes must leave blocks to run after the crash"
    url = f"sqlite:///{tmp_path / 'trm.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.gate.resume_worker", url, "g-crash", "4"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while blocks_on_record(url, "g-crash") < 3:
            assert child.poll() is None, "the worker ended before the crash"
            assert time.monotonic() < deadline, "the worker recorded no blocks in time"
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)  # it is now inside block 4, which hangs
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    seen: list[GateProgress] = []
    with open_store(url) as store:
        assert gate_info(store, "g-crash")["status"] == "running"  # nobody said it ended
        baseline, candidate = worker.arms()
        resumed = await worker.gate(store).resume(
            "g-crash", worker.POOL, baseline=baseline, candidate=candidate, progress=seen.append
        )
        same_outcome(resumed, reference)
        assert resumed.gate_id == "g-crash"
        info = gate_info(store, "g-crash")
        assert info["status"] == "decided" and info["verdict"] == reference.verdict
        assert info["pid"] == os.getpid()  # the lease moved to the process that resumed it
        assert info["blocks"] == reference.blocks
        assert [e.type for e in store.read_stream(gate_stream("g-crash"))].count(RESUMED) == 1
    # Progress: the blocks after the three replayed ones, ending with the verdict.
    assert [p.block for p in seen] == list(range(4, reference.blocks + 1))
    assert {p.resumed_from for p in seen} == {3}
    assert seen[-1].decision == reference.verdict
    assert seen[-1].units_total == len(worker.POOL)


async def test_a_failed_gate_resumes_and_asks_only_the_rest(store: Store) -> None:
    reference_store = store
    baseline, candidate = worker.arms()
    reference = await worker.gate(reference_store).run(
        "ref", worker.POOL, baseline=baseline, candidate=candidate, seed=worker.SEED
    )
    asked: list[str] = []
    failing = {"on": True}
    base, cand = worker.arms()

    async def flaky(unit_ids: Sequence[str]) -> list[QuestionResult]:
        if failing["on"] and len(asked) >= 2 * worker.BLOCK:
            raise ConnectionError("provider down")
        asked.extend(unit_ids)
        return list(await cand.evaluate(unit_ids))

    gate = worker.gate(store)
    with pytest.raises(ConnectionError):
        await gate.run("g-f", worker.POOL, baseline=base, candidate=Arm("cand@1", flaky), seed=7)
    assert gate_info(store, "g-f")["status"] == "failed"
    failing["on"] = False
    before = len(asked)
    resumed = await gate.resume("g-f", worker.POOL, baseline=base, candidate=Arm("cand@1", flaky))
    same_outcome(resumed, reference)
    # Nothing recorded is asked again: the first two blocks came from the log.
    assert set(asked[:before]).isdisjoint(asked[before:])
    assert len(asked) == resumed.units_evaluated


async def test_refuses_what_cannot_be_resumed(store: Store) -> None:
    pool = units(40)
    base, cand = Arm("b", table(pool, WRONG)), Arm("c", table(pool, OK))
    gate = Gate(store, block_size=10)
    with pytest.raises(GateNotResumableError, match="no gate"):
        await gate.resume("nope", pool, baseline=base, candidate=cand)
    await gate.run("done", pool, baseline=base, candidate=cand, seed=1)
    with pytest.raises(GateNotResumableError, match="decided already"):
        await gate.resume("done", pool, baseline=base, candidate=cand)

    release = asyncio.Event()

    async def slow(unit_ids: Sequence[str]) -> list[QuestionResult]:
        await release.wait()
        return table(pool, OK).results(unit_ids)

    running = asyncio.create_task(
        gate.run("live", pool, baseline=base, candidate=Arm("c", slow), seed=1)
    )
    await asyncio.sleep(0.2)
    version = len(store.read_stream(gate_stream("live")))
    with pytest.raises(GateNotResumableError, match="running in process"):
        await gate.resume("live", pool, baseline=base, candidate=cand)
    assert len(store.read_stream(gate_stream("live"))) == version  # nothing written
    # Silent longer than the caller allows: taken over, and the old runner is fenced off.
    await asyncio.sleep(0.05)
    taken = asyncio.create_task(
        gate.resume(
            "live", pool, baseline=base, candidate=cand, older_than=timedelta(milliseconds=10)
        )
    )
    result = await taken
    assert result.verdict == "accept"
    release.set()
    with pytest.raises(GateStateError, match="ended by another writer"):
        await running
    assert gate_info(store, "live")["verdict"] == "accept"


async def test_refuses_other_arms_parameters_or_pool(store: Store) -> None:
    pool = units(40)
    base, cand = Arm("b", table(pool, WRONG)), Arm("c", table(pool, OK))

    async def down(unit_ids: Sequence[str]) -> list[QuestionResult]:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        await Gate(store, block_size=10).run("g", pool, baseline=base, candidate=Arm("c", down))
    version = len(store.read_stream(gate_stream("g")))
    cases = [
        (Gate(store, block_size=10), pool, Arm("other", table(pool, OK)), "snapshots"),
        (Gate(store, block_size=20), pool, cand, "other parameters"),
        (Gate(store, block_size=10), pool[:-1], cand, "not 39"),
        # The same size: one unit swapped, or the same units in another order.
        (Gate(store, block_size=10), [*pool[:-1], "other"], cand, "other units"),
        (Gate(store, block_size=10), pool[::-1], cand, "another order"),
    ]
    for gate, units_, arm, why in cases:
        with pytest.raises(GateInputError, match=why):
            await gate.resume("g", units_, baseline=base, candidate=arm)
    assert len(store.read_stream(gate_stream("g"))) == version
    result = await Gate(store, block_size=10).resume("g", pool, baseline=base, candidate=cand)
    assert result.verdict == "accept"


@settings(max_examples=8, deadline=None)
@given(
    data=st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=30, max_size=60),
    fail_at=st.integers(1, 5),
    seed=st.integers(0, 2**31),
)
async def test_any_interruption_resumes_to_the_uninterrupted_outcome(
    data: list[tuple[bool, bool, bool]], fail_at: int, seed: int
) -> None:
    """Whatever the outcomes (INFRA included) and wherever a block fails, run + resume gives the
    uninterrupted run's verdict, W/L, e-values and INFRA counts."""
    pool = units(len(data))
    answers_b = {u: [OK if b else WRONG] for u, (b, _, _) in zip(pool, data, strict=True)}
    answers_c = {
        u: [(None, "error") if infra else OK if c else WRONG]
        for u, (_, c, infra) in zip(pool, data, strict=True)
    }
    with tempfile.TemporaryDirectory() as tmp, open_store(f"sqlite:///{tmp}/trm.db") as store:
        gate = Gate(store, block_size=6, infra_min_units=100)
        base = Arm("b", TableArm(answers_b))
        reference = await gate.run(
            "ref", pool, baseline=base, candidate=Arm("c", TableArm(answers_c)), seed=seed
        )
        failing = TableArm(answers_c, fail_on_call=fail_at)
        try:
            first = await gate.run("g", pool, baseline=base, candidate=Arm("c", failing), seed=seed)
        except RuntimeError:
            resumed = await gate.resume(
                "g", pool, baseline=base, candidate=Arm("c", TableArm(answers_c))
            )
        else:
            assume(False)  # decided before the failing block: nothing to resume
            resumed = first
        same_outcome(resumed, reference)
        assert (resumed.infra_units_baseline, resumed.infra_units_candidate) == (
            reference.infra_units_baseline,
            reference.infra_units_candidate,
        )
