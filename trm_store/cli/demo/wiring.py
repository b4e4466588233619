"""The wiring of one demo epoch: the governed client, the two arms, the gate, and then the
epoch's record in the workspace (runs, best on accept, the candidate's dual metric).

Salts: the candidate asks with a fresh salt per epoch (given by `run_demo`), so every epoch
re-samples it. The baseline asks with its snapshot as salt: it is a fixed reference, its unit
outcomes live in the baseline cache, and a unit that must be evaluated again (INFRA last time, so
never cached) replays the answers that did complete rather than mixing in new samples.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from trm_gate import INFRA_STOP_REASONS, Arm, Gate, GateProgress, GateResult, GateSettings
from trm_llm import (
    GovernedLLMClient,
    LLMSettings,
    RetryPolicy,
    StoreEventSink,
    client_from_settings,
)
from trm_store.cli.demo.arms import BreakerWait, DemoArm, Requeue
from trm_store.cli.demo.outcome import ArmSummary, DemoOptions, Endpoint
from trm_store.cli.demo.pool import POOL_VERSION, demo_pool
from trm_store.cli.demo.prompts import GRADER_VERSION, Prompt
from trm_store.connect import default_url
from trm_store.domain.metrics import write_dual_metric
from trm_store.domain.run_log import RunLog
from trm_store.domain.runs import read_predictions
from trm_store.domain.workspace import record_run, update_best, update_manifest
from trm_store.store import Store
from trm_store.store_url import parse_store_url

__all__ = [
    "DEMO_RETRY",
    "DEMO_SETTINGS",
    "WORKSPACE",
    "EpochRun",
    "cache_path_for",
    "gate_settings",
    "snapshot",
]

DEMO_RETRY = RetryPolicy(
    max_attempts=6, base_delay_s=0.05, max_delay_s=0.5, deadline_s=30.0, retry_after_cap_s=2.0
)
"""Demo-sized retries: short backoff, so a run with injected faults still ends in seconds."""

DEMO_SETTINGS: dict[str, Any] = {
    "llm_max_attempts": DEMO_RETRY.max_attempts,
    "llm_base_delay_s": DEMO_RETRY.base_delay_s,
    "llm_max_delay_s": DEMO_RETRY.max_delay_s,
    "llm_deadline_s": DEMO_RETRY.deadline_s,
    "llm_retry_after_cap_s": DEMO_RETRY.retry_after_cap_s,
    "llm_breaker_fail_threshold": 5,
    "llm_breaker_cooldown_s": 1.0,
    "llm_breaker_probe_timeout_s": 10.0,
}
"""`DEMO_RETRY` and the demo's breaker as settings; the rest of the demo's `LLMSettings` comes
from its options (`EpochRun.settings`)."""

WORKSPACE = "trm-demo"
BLOCK_SIZE = 12
REQUEUE = Requeue(max_times=3, max_wait_s=5.0)
CACHE_TTL_S = 7 * 86400


def gate_settings() -> GateSettings:
    """The demo's gate parameters: `$TRM_GATE_*` and `$TRM_GATE_CONFIG`, else blocks of 12."""
    return GateSettings.load(defaults={"block_size": BLOCK_SIZE})


def cache_path_for(store_url: str) -> Path:
    """The response cache file: next to a SQLite store (`trm.db` -> `trm-cache.db`), else ./"""
    url = parse_store_url(store_url)
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


class EpochRun:
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
        attempt: int = 0,
    ) -> None:
        self.store, self.options, self.endpoint = store, options, endpoint
        self.prompts = prompts
        self.epoch, self.gate_id = epoch, gate_id
        self.snapshots = (
            snapshot(endpoint, prompts[0], options.max_tokens),
            snapshot(endpoint, prompts[1], options.max_tokens),
        )
        self.salts = (f"baseline:{self.snapshots[0]}", candidate_salt)
        again = f"-r{attempt}" if attempt else ""  # attempt n > 0 resumes the gate (new runs)
        self.runs = (f"{gate_id}-baseline{again}", f"{gate_id}-candidate{again}")
        self.attempt = attempt
        self.cache_path = cache_path_for(default_url(options.db))

    def settings(self) -> LLMSettings:
        """The demo's client settings: its options, never the shell's LLM_* variables. The
        concurrency limiter starts at up to 4 calls in flight and may learn up to
        `--concurrency`."""
        simulated = self.endpoint.simulated  # its stalls are short; a real model may think
        ceiling = self.options.concurrency
        return LLMSettings.from_values(
            llm_base_url=self.endpoint.base_url,
            llm_model=self.endpoint.model,
            llm_api_key=self.options.api_key,
            llm_cache_url=f"sqlite:///{self.cache_path}",
            redis_cache_ttl=CACHE_TTL_S,
            llm_first_token_timeout_s=0.8 if simulated else 60.0,
            llm_inter_token_timeout_s=0.5 if simulated else 30.0,
            llm_concurrency_initial=min(4, ceiling),
            llm_concurrency_ceiling=ceiling,
            **DEMO_SETTINGS,
        )

    def _client(self, http: httpx.AsyncClient | None) -> GovernedLLMClient:
        return client_from_settings(self.settings(), sink=StoreEventSink(self.store), http=http)

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
        self,
        on_answer: Callable[[], None],
        http: httpx.AsyncClient | None,
        on_block: Callable[[GateProgress], None] | None = None,
    ) -> tuple[GateResult, tuple[DemoArm, DemoArm]]:
        """The gate over the whole pool; its result and the two arms (for their counters)."""
        pool = demo_pool()
        limiter = asyncio.Semaphore(self.options.concurrency)
        params = {"temperature": 0, "max_tokens": self.options.max_tokens}
        async with self._client(http) as client:
            assert client.breaker is not None  # client_from_settings always gives one
            wait = BreakerWait(client.breaker, client.source, REQUEUE)
            with (
                RunLog(self.store, self.runs[0], config=self._config(0)) as base_log,
                RunLog(self.store, self.runs[1], config=self._config(1)) as cand_log,
            ):
                settings = gate_settings()
                arms = tuple(
                    DemoArm(
                        client,
                        pool,
                        prompt.text,
                        salt,
                        log,
                        limiter,
                        wait,
                        params,
                        on_answer,
                        infra_reasons=settings.infra_reasons,
                    )
                    for prompt, salt, log in zip(
                        self.prompts, self.salts, (base_log, cand_log), strict=True
                    )
                )
                gate = Gate.from_settings(self.store, settings)
                baseline = Arm(self.snapshots[0], arms[0].evaluate)
                candidate = Arm(self.snapshots[1], arms[1].evaluate)
                if self.attempt:
                    result = await gate.resume(
                        self.gate_id,
                        pool.units(),
                        baseline=baseline,
                        candidate=candidate,
                        progress=on_block,
                    )
                else:
                    result = await gate.run(
                        self.gate_id,
                        pool.units(),
                        baseline=baseline,
                        candidate=candidate,
                        seed=self.options.seed,
                        progress=on_block,
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
