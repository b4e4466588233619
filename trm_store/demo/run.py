"""`run_demo`: one gated epoch end to end, the way a harness would wire trm.

Store (SQLite by default) -> workspace manifest (scaffolded once; the epoch counter lives there)
-> endpoint (a real OpenAI-compatible one, or the simulated model on loopback with faults) ->
governed client (SQLite response cache, circuit breaker, short retries, events to the store) ->
gate (baseline arm vs candidate arm over the bundled pool, one `RunLog` per arm) -> the epoch's
outcome in the workspace (runs, best on accept, the candidate's dual metric) -> the summary, read
back from the events.

Salts: the candidate asks with a fresh salt per epoch (`{workspace}:{token}:e{n}`, the token
drawn when the workspace is scaffolded, so a deleted store never meets its old cache), so every
epoch re-samples it. The baseline asks with its snapshot as salt: it is a fixed reference, its
unit outcomes live in the baseline cache, and a unit that must be evaluated again (INFRA last
time, so never cached) replays the answers that did complete rather than mixing in new samples.
The demo keeps its baseline fixed across epochs (a real loop would promote an accepted
candidate), so a second run shows the baseline cache at work.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import make_url

from trm_gate import INFRA_STOP_REASONS, Arm, Gate, GateResult
from trm_llm import (
    CircuitBreaker,
    GovernedLLMClient,
    RetryPolicy,
    SqliteResponseCache,
    StoreEventSink,
)
from trm_store.bootstrap import open_store
from trm_store.cli_gate_report import load_report
from trm_store.connect import default_url
from trm_store.demo.arms import BreakerWait, DemoArm, Requeue
from trm_store.demo.faults import FaultPlan
from trm_store.demo.model import SimulatedModel
from trm_store.demo.outcome import ArmSummary, DemoOptions, DemoOutcome, Endpoint
from trm_store.demo.pool import POOL_VERSION, demo_pool
from trm_store.demo.prompts import (
    GRADER_VERSION,
    Prompt,
    baseline_prompt,
    candidate_prompt,
)
from trm_store.demo.server import SIMULATED_BASE_URL, DemoServer, loopback_http
from trm_store.demo.stats import collect
from trm_store.domain.errors import UnknownWorkspaceError
from trm_store.domain.metrics import write_dual_metric
from trm_store.domain.run_log import RunLog
from trm_store.domain.runs import read_predictions
from trm_store.domain.workspace import (
    get_manifest,
    record_run,
    scaffold_workspace,
    update_best,
    update_manifest,
)
from trm_store.store import Store

DEMO_RETRY = RetryPolicy(
    max_attempts=6, base_delay_s=0.05, max_delay_s=0.5, deadline_s=30.0, retry_after_cap_s=2.0
)
"""Demo-sized retries: short backoff, so a run with injected faults still ends in seconds."""

__all__ = ["cache_path_for", "run_demo", "snapshot"]

WORKSPACE = "trm-demo"
BLOCK_SIZE = 12
REQUEUE = Requeue(max_times=3, max_wait_s=5.0)
CACHE_TTL_S = 7 * 86400
SIM_STALL_S = 1.5  # the simulated server's stalls; its client gives up on silence much sooner


def cache_path_for(store_url: str) -> Path:
    """The response cache file: next to a SQLite store (`trm.db` -> `trm-cache.db`), else ./"""
    url = make_url(store_url)
    if url.get_backend_name() == "sqlite" and url.database:
        path = Path(url.database).expanduser().resolve()
        return path.with_name(f"{path.stem}-cache.db")
    return Path("trm-cache.db").resolve()


def snapshot(endpoint: Endpoint, prompt: Prompt, max_tokens: int) -> str:
    """The baseline cache key: everything that decides an outcome (SPEC §3)."""
    where = "sim" if endpoint.simulated else "ep-" + _digest(endpoint.base_url)
    model = endpoint.model if len(endpoint.model) <= 80 else "m-" + _digest(endpoint.model)
    return "|".join(
        (model, where, prompt.version, POOL_VERSION, GRADER_VERSION, f"T0-mt{max_tokens}")
    )


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _workspace(store: Store, base: Prompt) -> dict[str, Any]:
    """The demo's workspace manifest, scaffolded on first use."""
    try:
        return get_manifest(store, WORKSPACE)
    except UnknownWorkspaceError:
        scaffold_workspace(
            store,
            WORKSPACE,
            skills={},
            prompts={"baseline": {"version": base.version, "text": base.text}},
            pool=POOL_VERSION,
            salt_token=uuid.uuid4().hex[:8],
            epoch=0,
        )
        return get_manifest(store, WORKSPACE)


@contextmanager
def _endpoint(options: DemoOptions, epoch: int) -> Iterator[tuple[Endpoint, DemoServer | None]]:
    """The real endpoint as given, or the simulated server (in its own thread) for the run."""
    if options.base_url is not None:
        assert options.model is not None, "the CLI checks --model goes with --base-url"
        yield Endpoint(options.base_url.rstrip("/"), options.model, simulated=False), None
        return
    model = SimulatedModel(options.seed)
    server = DemoServer(model, FaultPlan(options.seed, epoch), stall_s=SIM_STALL_S)
    stop = server.run_in_thread()
    try:
        yield Endpoint(SIMULATED_BASE_URL, model.name, True, server.base_url), server
    finally:
        stop()


async def run_demo(
    options: DemoOptions, *, on_answer: Callable[[], None] = lambda: None
) -> DemoOutcome:
    """Run one gated epoch (see the module docstring); `on_answer` ticks once per question."""
    started = time.perf_counter()
    with open_store(options.db) as store:
        head = store.head_position()
        base, cand = baseline_prompt(), candidate_prompt(options.seed)
        manifest = _workspace(store, base)
        epoch = int(manifest.get("epoch", 0)) + 1
        gate_id = f"demo-e{epoch}-{uuid.uuid4().hex[:6]}"
        update_manifest(store, WORKSPACE, epoch=epoch, last_gate=gate_id)
        with _endpoint(options, epoch) as (endpoint, server):
            salt = f"{WORKSPACE}:{manifest['salt_token']}:e{epoch}"
            epoch_run = _EpochRun(store, options, endpoint, (base, cand), epoch, gate_id, salt)
            http = None if server is None else loopback_http(server)
            try:
                result, arms = await epoch_run.run(on_answer, http)
            finally:
                if http is not None:
                    await http.aclose()
        injected = dict(server.injected) if server is not None else None
        metric = epoch_run.record(result)
        cached = store.read_stream(f"baseline:{epoch_run.snapshots[0]}")
        return DemoOutcome(
            result=result,
            report=load_report(store, gate_id),
            store_url=store.url,
            cache_path=epoch_run.cache_path,
            endpoint=endpoint,
            workspace=WORKSPACE,
            epoch=epoch,
            pool_questions=len(demo_pool().questions),
            baseline=epoch_run.summary(0, arms[0]),
            candidate=epoch_run.summary(1, arms[1]),
            baseline_cached=sum(
                e.position > head and e.type == "baseline.unit_cached" for e in cached
            ),
            metric_written=metric,
            calls=collect(store, source=endpoint.model, after=head),
            injected=injected,
            events=store.head_position() - head,
            elapsed_s=time.perf_counter() - started,
        )


class _EpochRun:
    """The wiring of one epoch: client, arms and gate; then its record in the workspace."""

    def __init__(
        self,
        store: Store,
        options: DemoOptions,
        endpoint: Endpoint,
        prompts: tuple[Prompt, Prompt],
        epoch: int,
        gate_id: str,
        candidate_salt: str,
    ) -> None:
        self.store, self.options, self.endpoint = store, options, endpoint
        self.prompts = prompts
        self.epoch, self.gate_id = epoch, gate_id
        self.snapshots = (
            snapshot(endpoint, prompts[0], options.max_tokens),
            snapshot(endpoint, prompts[1], options.max_tokens),
        )
        self.salts = (f"baseline:{self.snapshots[0]}", candidate_salt)
        self.runs = (f"{gate_id}-baseline", f"{gate_id}-candidate")
        self.cache_path = cache_path_for(default_url(options.db))

    def _client(self, breaker: CircuitBreaker, http: httpx.AsyncClient | None) -> GovernedLLMClient:
        sink = StoreEventSink(self.store)
        simulated = self.endpoint.simulated  # its stalls are short; a real model may think
        return GovernedLLMClient(
            self.endpoint.base_url,
            self.endpoint.model,
            api_key=self.options.api_key,
            cache=SqliteResponseCache(self.cache_path, ttl_s=CACHE_TTL_S, sink=sink),
            breaker=breaker,
            retry=DEMO_RETRY,
            sink=sink,
            http=http,
            first_token_timeout_s=0.8 if simulated else 60.0,
            inter_token_timeout_s=0.5 if simulated else 30.0,
        )

    def _config(self, i: int) -> dict[str, Any]:
        return {
            "gate_id": self.gate_id,
            "arm": ("baseline", "candidate")[i],
            "snapshot": self.snapshots[i],
            "prompt_version": self.prompts[i].version,
            "cache_salt": self.salts[i],
            "model": self.endpoint.model,
            "simulated": self.endpoint.simulated,
            "epoch": self.epoch,
            "workspace": WORKSPACE,
        }

    async def run(
        self, on_answer: Callable[[], None], http: httpx.AsyncClient | None
    ) -> tuple[GateResult, tuple[DemoArm, DemoArm]]:
        """The gate over the whole pool; its result and the two arms (for their counters)."""
        pool = demo_pool()
        limiter = asyncio.Semaphore(self.options.concurrency)
        params = {"temperature": 0, "max_tokens": self.options.max_tokens}
        breaker = CircuitBreaker(fail_threshold=5, cooldown_s=1.0, probe_timeout_s=10.0)
        wait = BreakerWait(breaker, self.endpoint.model, REQUEUE)
        async with self._client(breaker, http) as client:
            with (
                RunLog(self.store, self.runs[0], config=self._config(0)) as base_log,
                RunLog(self.store, self.runs[1], config=self._config(1)) as cand_log,
            ):
                arms = tuple(
                    DemoArm(client, pool, prompt.text, salt, log, limiter, wait, params, on_answer)
                    for prompt, salt, log in zip(
                        self.prompts, self.salts, (base_log, cand_log), strict=True
                    )
                )
                gate = Gate(self.store, alpha=0.05, beta=0.2, p1=0.6, block_size=BLOCK_SIZE)
                result = await gate.run(
                    self.gate_id,
                    pool.units(),
                    baseline=Arm(self.snapshots[0], arms[0].evaluate),
                    candidate=Arm(self.snapshots[1], arms[1].evaluate),
                    seed=self.options.seed,
                )
        return result, (arms[0], arms[1])

    def summary(self, i: int, arm: DemoArm) -> ArmSummary:
        return ArmSummary(
            run_id=self.runs[i],
            prompt=self.prompts[i],
            snapshot=self.snapshots[i],
            salt=self.salts[i],
            units=list(arm.units),
            questions=arm.asked,
            stops=dict(arm.stops),
            requeued=arm.requeued,
            last_error=arm.last_error,
        )

    def record(self, result: GateResult) -> bool:
        """The epoch in the workspace: both runs, the verdict, the best on accept, and the
        candidate's accuracy as its dual metric; whether there was anything graded to measure."""
        for i, run_id in enumerate(self.runs):
            record_run(
                self.store,
                WORKSPACE,
                run_id,
                arm=("baseline", "candidate")[i],
                epoch=self.epoch,
                gate_id=self.gate_id,
                snapshot=self.snapshots[i],
            )
        update_manifest(self.store, WORKSPACE, last_verdict=result.verdict)
        cand = self.prompts[1]
        if result.verdict == "accept":
            update_best(
                self.store,
                WORKSPACE,
                run_id=self.runs[1],
                epoch=self.epoch,
                gate_id=self.gate_id,
                prompts_version=cand.version,
                prompt=cand.text,
                e_value=result.e_value,
            )
        graded = [
            p
            for p in read_predictions(self.store, self.runs[1])
            if p["stop_reason"] not in INFRA_STOP_REASONS
        ]
        if not graded:
            return False
        write_dual_metric(
            self.store,
            run_id=self.runs[1],
            epoch=self.epoch,
            version_kind="final",
            skills_version="none",
            prompts_version=cand.version,
            pool=POOL_VERSION,
            hard_acc=sum(bool(p["correct"]) for p in graded) / len(graded),
        )
        return True
