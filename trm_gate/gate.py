"""`Gate.run`: the block loop around the pure step, with the baseline cache and the event log.

Per block: look up the baseline cache; evaluate the baseline's misses and the candidate
concurrently; fold and pair; step (the INFRA guard runs inside); only then, and only if the
guard did not trip, cache the block's non-INFRA baseline outcomes; record `gate.block_evaluated`
(with `gate.decided`, in the same append, when the gate ends).

Failure semantics: bad arguments raise GateInputError before anything is written; a gate id
with events already raises GateStateError; an exception from an arm's `evaluate` (or
ArmResultError for answers to the wrong units) propagates with nothing cached or recorded for
that block, and the gate is recorded `failed` with its earlier blocks on record. `Gate.resume`
continues a failed or crashed gate with its next block (`trm_gate.resume`); a `progress`
callback sees each block as it is recorded.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from trm_gate._checks import check_count, check_id
from trm_gate.config import GateConfig
from trm_gate.errors import ArmResultError, GateInputError, GateStateError
from trm_gate.pairing import BlockPairing, InfraPolicy, pair_block
from trm_gate.results import QuestionResult, UnitOutcome, fold_unit, fold_units
from trm_gate.resume import pool_digest, take_over
from trm_gate.step import Decision, GateState, Verdict, step
from trm_store import ConcurrencyError, NewEvent, Store, StoreError
from trm_store.domain.baseline import BaselineCache, BaselineOutcome
from trm_store.domain.gates import BLOCK_EVALUATED, DECIDED, FAILED, STARTED, gate_stream
from trm_store.vocabulary import INFRA_STOP_REASONS

if TYPE_CHECKING:
    from trm_gate.settings import GateSettings

_log = logging.getLogger(__name__)

__all__ = ["Arm", "Evaluate", "Gate", "GateProgress", "GateResult", "Progress"]

Evaluate = Callable[[Sequence[str]], Awaitable[Sequence[QuestionResult]]]
"""Evaluates an arm on some units: every question of every unit asked, nothing else."""

_NAME_MAX = 200  # `baseline:{snapshot}` and `gate:{id}` must fit the log's 255-character ids
_UNIT_ID_MAX = 200  # the baseline cache's limit on unit ids
_SEED_LIMIT = 2**63


@dataclass(frozen=True, slots=True)
class Arm:
    """One side of the gate. `snapshot` names everything that determines an outcome (prompts and
    skills versions, model, decoding params, grader version): it keys the baseline cache."""

    snapshot: str
    evaluate: Evaluate

    def __post_init__(self) -> None:
        check_id("snapshot", self.snapshot, _NAME_MAX)
        if not callable(self.evaluate):
            raise GateInputError("evaluate must be an async callable (unit_ids) -> results")


@dataclass(frozen=True, slots=True)
class GateResult:
    """The gate's outcome. e_value / futility_e_value are E+ and E- when it stopped."""

    verdict: Verdict
    wins: int
    losses: int
    ties: int
    infra_units_baseline: int
    infra_units_candidate: int
    e_value: float
    futility_e_value: float
    units_evaluated: int
    baseline_cache_hits: int
    gate_id: str
    seed: int
    reason: str
    blocks: int


@dataclass(frozen=True, slots=True)
class GateProgress:
    """Where a gate is after a recorded block: for progress bars and harness logs. `blocks` and
    `units_total` cover the whole pool (the gate may stop sooner); `decision` is "continue" or
    the verdict; `resumed_from` the blocks replayed by `Gate.resume` (0 for a fresh run)."""

    gate_id: str
    block: int
    blocks: int
    units_done: int
    units_total: int
    e_value: float
    futility_e_value: float
    wins: int
    losses: int
    ties: int
    decision: str
    resumed_from: int = 0


Progress = Callable[[GateProgress], None]
"""Called after each block is recorded, in the gate's task; an exception from it fails the gate."""


class Gate:
    """An anytime-valid block-sequential gate of a candidate against a baseline (SPEC §3).

    The parameters are `GateConfig`'s: infra_policy "bounded" (default) keeps the type-I error
    whatever causes INFRA, "exclude" only when INFRA is independent of the outcomes;
    infra_reasons (default {error, parse_error}) are the stop reasons that count as INFRA;
    infra_max_rate, infra_margin, infra_alpha and infra_min_units set the guard's tests.
    """

    def __init__(
        self,
        store: Store,
        *,
        alpha: float = 0.05,
        beta: float = 0.2,
        p1: float = 0.6,
        block_size: int = 20,
        max_pairs: int | None = None,
        infra_max_rate: float = 0.2,
        infra_min_units: int = 10,
        infra_policy: InfraPolicy = "bounded",
        infra_reasons: frozenset[str] = INFRA_STOP_REASONS,
        infra_margin: float = 0.0,
        infra_alpha: float = 0.05,
    ) -> None:
        self._store = store
        self._cache = BaselineCache(store)
        self.config = GateConfig(
            alpha=alpha,
            beta=beta,
            p1=p1,
            block_size=block_size,
            max_pairs=max_pairs,
            infra_max_rate=infra_max_rate,
            infra_min_units=infra_min_units,
            infra_policy=infra_policy,
            infra_reasons=infra_reasons,
            infra_margin=infra_margin,
            infra_alpha=infra_alpha,
        )

    @classmethod
    def from_settings(cls, store: Store, settings: GateSettings) -> Gate:
        """A gate with the parameters of `settings` (`trm_gate.GateSettings`: file and env)."""
        return cls(store, **settings.gate_kwargs())

    async def run(
        self,
        gate_id: str,
        unit_ids: Sequence[str],
        *,
        baseline: Arm,
        candidate: Arm,
        seed: int | None = None,
        progress: Progress | None = None,
    ) -> GateResult:
        """Run the gate over `unit_ids` (shuffled with `seed`, random if None; it is recorded);
        `progress` is called after each recorded block."""
        pool = _check_call(gate_id, unit_ids, baseline, candidate, progress)
        if seed is None:
            seed = secrets.randbits(32)
        elif check_count("seed", seed) >= _SEED_LIMIT:
            raise GateInputError(f"seed must be < 2**63, got {seed}")
        order = list(pool)
        random.Random(seed).shuffle(order)
        stream = gate_stream(gate_id)
        started = {
            "baseline_snapshot": baseline.snapshot,
            "candidate_snapshot": candidate.snapshot,
            "seed": seed,
            "pool_size": len(order),
            "config": self.config.to_record(),
            "pool_digest": pool_digest(pool),
        }
        try:
            version = self._store.append(stream, [NewEvent(STARTED, started)], expected_version=0)
        except ConcurrencyError as e:
            raise GateStateError(f"gate {gate_id!r} has events already; use a new id") from e
        state = GateState(self.config)
        arms = (baseline, candidate)
        return await self._drive(gate_id, seed, order, state, version[-1].version, arms, progress)

    async def resume(
        self,
        gate_id: str,
        unit_ids: Sequence[str],
        *,
        baseline: Arm,
        candidate: Arm,
        progress: Progress | None = None,
        older_than: timedelta | None = None,
    ) -> GateResult:
        """Continue gate `gate_id` after a crash or a failure, with its next block.

        Its recorded blocks are replayed (same seed, so the same unit order; same e-values and
        guard), then the remaining blocks run as in `run`. `unit_ids`, the arms' snapshots and
        this Gate's parameters must be those it started with (else GateInputError). A gate that
        decided, or that is `running` in a process still alive (or, with `older_than`, that wrote
        within that window), is refused with GateNotResumableError; so is a gate never started.
        """
        pool = _check_call(gate_id, unit_ids, baseline, candidate, progress)
        snapshots = (baseline.snapshot, candidate.snapshot)
        taken = take_over(self._store, gate_id, self.config, pool, snapshots, older_than=older_than)
        arms = (baseline, candidate)
        return await self._drive(
            gate_id, taken.seed, taken.order, taken.state, taken.at, arms, progress
        )

    async def _drive(
        self,
        gate_id: str,
        seed: int,
        order: list[str],
        state: GateState,
        at: int,
        arms: tuple[Arm, Arm],
        progress: Progress | None,
    ) -> GateResult:
        """The block loop from the block after `state.blocks`, the stream at version `at`."""
        stream = gate_stream(gate_id)
        baseline, candidate = arms
        size = self.config.block_size
        blocks = [order[i : i + size] for i in range(0, len(order), size)]
        resumed_from = state.blocks
        for index in range(resumed_from + 1, len(blocks) + 1):
            block_ids = blocks[index - 1]
            try:
                state, decision, at = await self._block(
                    stream,
                    index,
                    block_ids,
                    baseline,
                    candidate,
                    state,
                    at,
                    final=index == len(blocks),
                )
                if progress is not None:
                    progress(_progress(gate_id, state, decision.verdict, order, size, resumed_from))
            except BaseException as e:  # an arm failed or we were cancelled: say so, then re-raise
                self._record_failure(stream, index, e, at)
                raise
            if decision.final:
                break
        return _result(state, gate_id, seed)

    def _record_failure(self, stream: str, block: int, error: BaseException, at: int) -> None:
        """Append `gate.failed`, so the gate is not `running` forever; never mask `error`. At the
        version the gate last wrote: a gate already ended elsewhere (marked stale) is left so."""
        text = failure_reason(error, block)[:1000]
        try:
            self._store.append(
                stream, [NewEvent(FAILED, {"error": text, "block": block})], expected_version=at
            )
        except ConcurrencyError:
            _log.info("%s was already ended by another writer; its failure is not recorded", stream)
        except StoreError:
            _log.exception("could not record the failure of %s", stream)

    async def _block(
        self,
        stream: str,
        index: int,
        block_ids: list[str],
        baseline: Arm,
        candidate: Arm,
        state: GateState,
        at: int,
        *,
        final: bool,
    ) -> tuple[GateState, Decision, int]:
        reasons = self.config.infra_reasons
        cached = {
            u: _from_cache(o, reasons)
            for u in block_ids
            if (o := self._cache.get(baseline.snapshot, u))
        }
        # A cached unit that is INFRA under this gate's reasons is evaluated again, like a miss.
        hits = {u: o for u, o in cached.items() if not o.infra}
        misses = [u for u in block_ids if u not in hits]
        base_results, cand_results = await _both(
            _evaluate(baseline, misses), _evaluate(candidate, block_ids)
        )
        base = {**hits, **fold_units(base_results, misses, infra_reasons=reasons)}
        cand = fold_units(cand_results, block_ids, infra_reasons=reasons)
        pairing = pair_block(base, cand, cached=hits.keys())
        state, decision = step(state, pairing, final=final)
        if decision.verdict != "infra_abort":  # the guard runs before anything is cached
            for u in misses:
                if _cacheable(base[u]):
                    self._cache.put(baseline.snapshot, u, base[u])
        events = [
            NewEvent(
                BLOCK_EVALUATED, _block_data(index, block_ids, base, cand, pairing, state, decision)
            )
        ]
        if decision.final:
            events.append(NewEvent(DECIDED, _decided_data(state)))
        try:
            recorded = self._store.append(stream, events, expected_version=at)
        except ConcurrencyError as e:
            raise GateStateError(
                f"{stream} was ended by another writer (e.g. `trm gates --mark-stale`) while "
                f"block {index} ran; its verdict would contradict the log, so it is not written"
            ) from e
        return state, decision, recorded[-1].version


def _check_call(
    gate_id: str,
    unit_ids: Sequence[str],
    baseline: Arm,
    candidate: Arm,
    progress: Progress | None,
) -> list[str]:
    """The arguments `run` and `resume` share, checked before anything is written; the pool."""
    check_id("gate_id", gate_id, _NAME_MAX)
    pool = _check_pool(unit_ids)
    for name, arm in (("baseline", baseline), ("candidate", candidate)):
        if not isinstance(arm, Arm):
            raise GateInputError(f"{name} must be an Arm, got {type(arm).__name__}")
    if progress is not None and not callable(progress):
        raise GateInputError(f"progress must be callable, got {progress!r}")
    return pool


def _progress(
    gate_id: str, state: GateState, decision: str, order: list[str], size: int, resumed_from: int
) -> GateProgress:
    return GateProgress(
        gate_id=gate_id,
        block=state.blocks,
        blocks=-(-len(order) // size),
        units_done=min(len(order), state.blocks * size),
        units_total=len(order),
        e_value=state.e_value,
        futility_e_value=state.futility_e_value,
        wins=state.wins,
        losses=state.losses,
        ties=state.ties,
        decision=decision,
        resumed_from=resumed_from,
    )


def _check_pool(unit_ids: Sequence[str]) -> list[str]:
    if isinstance(unit_ids, str) or not isinstance(unit_ids, Iterable):
        raise GateInputError("unit_ids must be a sequence of unit id strings")
    pool = [check_id("unit id", u, _UNIT_ID_MAX) for u in unit_ids]
    if not pool:
        raise GateInputError("the unit pool is empty")
    if len(set(pool)) != len(pool):
        dupes = sorted(u for u, n in Counter(pool).items() if n > 1)
        raise GateInputError(f"unit ids appear more than once: {dupes[:10]}")
    return pool


async def _both(
    first: Awaitable[Sequence[QuestionResult]], second: Awaitable[Sequence[QuestionResult]]
) -> tuple[Sequence[QuestionResult], Sequence[QuestionResult]]:
    """Await both arms concurrently; if one fails, cancel the other and raise the failure
    itself (not an ExceptionGroup, so callers can catch e.g. trm_llm's errors directly)."""
    tasks = [asyncio.ensure_future(first), asyncio.ensure_future(second)]
    try:
        a, b = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return a, b


async def _evaluate(arm: Arm, unit_ids: list[str]) -> Sequence[QuestionResult]:
    if not unit_ids:
        return []
    results = await arm.evaluate(list(unit_ids))
    if isinstance(results, str) or not isinstance(results, Iterable):
        raise ArmResultError(
            f"evaluate of {arm.snapshot!r} returned {type(results).__name__}, not results"
        )
    return list(results)


def _from_cache(outcome: BaselineOutcome, infra_reasons: frozenset[str]) -> UnitOutcome:
    return fold_unit(
        (
            QuestionResult(q.question_id, outcome.unit_id, q.correct, q.stop_reason)
            for q in outcome.results
        ),
        infra_reasons=infra_reasons,
    )


def _cacheable(outcome: UnitOutcome) -> bool:
    """Never cache an INFRA unit: neither under the gate's reasons nor the vocabulary's (the
    cache refuses those, whatever a gate counts)."""
    return not outcome.infra and not any(r.infra for r in outcome.results)


def _block_data(
    index: int,
    block_ids: list[str],
    base: dict[str, UnitOutcome],
    cand: dict[str, UnitOutcome],
    pairing: BlockPairing,
    state: GateState,
    decision: Decision,
) -> dict[str, object]:
    return {
        "block": index,
        "unit_ids": block_ids,
        "wins": pairing.wins,
        "losses": pairing.losses,
        "ties": pairing.ties,
        "infra_baseline": [u for u in block_ids if base[u].infra],
        "infra_candidate": [u for u in block_ids if cand[u].infra],
        "baseline_cache_hits": pairing.baseline_cache_hits,
        "log_e_value": state.log_e_value,
        "log_futility_e_value": state.log_futility_e_value,
        "decision": decision.verdict,
        "deltas": list(pairing.deltas),
        "infra_scores": [list(scores) for scores in pairing.infra_scores],
    }


def _decided_data(state: GateState) -> dict[str, object]:
    return {
        "verdict": state.verdict,
        "reason": state.reason[:1000],
        "blocks": state.blocks,
        "units_evaluated": state.units,
        "wins": state.wins,
        "losses": state.losses,
        "ties": state.ties,
        "infra_units_baseline": state.infra_baseline,
        "infra_units_candidate": state.infra_candidate,
        "baseline_cache_hits": state.baseline_cache_hits,
        "log_e_value": state.log_e_value,
        "log_futility_e_value": state.log_futility_e_value,
    }


def _result(state: GateState, gate_id: str, seed: int) -> GateResult:
    assert state.verdict is not None, "the last block is final, so the state has a verdict"
    return GateResult(
        verdict=state.verdict,
        wins=state.wins,
        losses=state.losses,
        ties=state.ties,
        infra_units_baseline=state.infra_baseline,
        infra_units_candidate=state.infra_candidate,
        e_value=state.e_value,
        futility_e_value=state.futility_e_value,
        units_evaluated=state.units,
        baseline_cache_hits=state.baseline_cache_hits,
        gate_id=gate_id,
        seed=seed,
        reason=state.reason,
        blocks=state.blocks,
    )


def failure_reason(error: BaseException, block: int) -> str:
    """`Type: message`; an error with no message (a cancelled task, Ctrl-C) says what happened
    instead of an empty `CancelledError: `."""
    message = str(error).strip()
    if message:
        return f"{type(error).__name__}: {message}"
    if isinstance(error, asyncio.CancelledError | KeyboardInterrupt):
        return f"{type(error).__name__}: interrupted in block {block} (the gate's task was stopped)"
    return f"{type(error).__name__} (no message) in block {block}"
