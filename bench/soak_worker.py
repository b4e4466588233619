"""A soak worker (gated evaluations in a loop, until SIGTERM or SIGKILL) and the soak's follower.

    python bench/soak_worker.py worker CONFIG.json INDEX INCARNATION
    python bench/soak_worker.py follow CONFIG.json

The worker wires trm as a harness would: one `GovernedLLMClient` (shared Redis response cache,
Redis-shared circuit breaker, events to the store) and, per gate, the demo's arms (`DemoArm`,
one `RunLog` each) under `trm_gate.Gate`. It reports, line by line, every event the store
acknowledged (`acks-*`) and every probe lease the breaker handed it (`probes-*`). SIGTERM cancels
the gate in hand (its calls end `cancelled`, its runs `failed`) and ends it cleanly; SIGKILL,
from the supervisor, ends it anywhere.

The follower reads the log by position while the workers write, and records every position it
sees, in order, until the supervisor tells it the head to reach.
"""

from __future__ import annotations

import asyncio
import faulthandler
import itertools
import random
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import redis
import redis.asyncio
from soak_common import BASELINES, CANDIDATES, PARAMS, LineLog, SoakConfig

from trm_gate import Arm, Gate
from trm_llm import (
    CircuitBreaker,
    GovernedLLMClient,
    RedisResponseCache,
    StoreEventSink,
)
from trm_llm.breaker import Admission, Transition
from trm_store import RecordedEvent, Store, open_store
from trm_store.cli.demo.arms import BreakerWait, DemoArm, Requeue
from trm_store.cli.demo.outcome import Endpoint
from trm_store.cli.demo.pool import demo_pool
from trm_store.cli.demo.prompts import Prompt
from trm_store.cli.demo.wiring import DEMO_RETRY, snapshot
from trm_store.domain.run_log import RunLog

REQUEUE = Requeue(max_times=3, max_wait_s=5.0)
CONCURRENCY = 8


class AuditedBreaker(CircuitBreaker):
    """The shared breaker, writing down when each probe lease starts and may end.

    A probe's start is written with the times just before and just after the Redis update that
    granted it; its end, the outcome or release reported with its token, with the time just
    before the update that ends it, whatever that update returns: an update whose reply timed out
    may still have been applied by Redis. So a later admission, in any process, is always written
    with a time after the end that allowed it.
    """

    def __init__(self, audit: LineLog, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._audit = audit

    async def aadmit(self, source: str, now: float) -> Admission:
        t0 = time.time()
        admission = await super().aadmit(source, now)
        if admission.probe_token is not None:
            new_window = admission.transition is not None  # open -> half_open
            self._audit.write(
                {
                    "k": "probe",
                    "tok": admission.probe_token,
                    "t0": t0,
                    "t1": time.time(),
                    "new_window": new_window,
                    # Redis unreachable: admitted on this process's local state (by design)
                    "local": bool(getattr(self._store, "degraded", False)),
                }
            )
        return admission

    async def arecord_failure(
        self, source: str, now: float, *, admission: Admission | None = None
    ) -> Transition | None:
        self._ending(admission)
        return await super().arecord_failure(source, now, admission=admission)

    async def arecord_success(
        self, source: str, *, now: float | None = None, admission: Admission | None = None
    ) -> Transition | None:
        self._ending(admission)
        return await super().arecord_success(source, now=now, admission=admission)

    async def arelease_probe(self, source: str, token: str) -> None:
        self._audit.write({"k": "end", "tok": token, "t": time.time()})
        await super().arelease_probe(source, token)

    def _ending(self, admission: Admission | None) -> None:
        if admission is not None and admission.probe_token is not None:
            self._audit.write({"k": "end", "tok": admission.probe_token, "t": time.time()})


def acknowledging(store: Store, acks: LineLog) -> Store:
    """`store` with every acknowledged append written to `acks` (position and event id)."""
    append, append_batch = store.append, store.append_batch

    def ack(events: list[RecordedEvent]) -> list[RecordedEvent]:
        for e in events:
            acks.write({"pos": e.position, "id": e.event_id})
        return events

    def acked_append(*args: Any, **kwargs: Any) -> list[RecordedEvent]:
        return ack(append(*args, **kwargs))

    def acked_batch(*args: Any, **kwargs: Any) -> list[RecordedEvent]:
        return ack(append_batch(*args, **kwargs))

    store.append = acked_append  # type: ignore[method-assign]
    store.append_batch = acked_batch  # type: ignore[method-assign]
    return store


class Worker:
    """Gates in a loop until SIGTERM; every piece shared with the other workers."""

    def __init__(self, cfg: SoakConfig, index: int, incarnation: int) -> None:
        self.cfg, self.index, self.incarnation = cfg, index, incarnation
        self.rng = random.Random(f"{cfg.namespace}/{index}/{incarnation}")
        self.endpoint = Endpoint(cfg.base_url, cfg.model, simulated=True)

    async def run(self) -> None:
        cfg, tag = self.cfg, f"w{self.index}-{self.incarnation}"
        work = Path(cfg.workdir)
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        audit = LineLog(work / f"probes-{tag}.jsonl")
        redis_sync = redis.Redis.from_url(cfg.redis_url)
        redis_async = redis.asyncio.Redis.from_url(cfg.redis_url)
        breaker = AuditedBreaker(
            audit,
            fail_threshold=5,
            cooldown_s=1.0,
            probe_timeout_s=cfg.probe_timeout_s,
            redis_client=redis_sync,
            namespace=cfg.breaker_namespace,
        )
        with acknowledging(open_store(cfg.store_url), LineLog(work / f"acks-{tag}.jsonl")) as store:
            sink = StoreEventSink(store)
            client = GovernedLLMClient(
                cfg.base_url,
                cfg.model,
                cache=RedisResponseCache(
                    redis_async, ttl_s=3600, namespace=cfg.cache_namespace, sink=sink
                ),
                breaker=breaker,
                retry=DEMO_RETRY,
                sink=sink,
                http=httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None)),
                first_token_timeout_s=0.8,
                inter_token_timeout_s=0.5,
            )
            wait = BreakerWait(breaker, cfg.model, REQUEUE)
            try:
                async with client:
                    for n in itertools.count(1):
                        await self._gate(store, client, wait, f"soak-{tag}-{n}", n)
            except asyncio.CancelledError:
                pass  # SIGTERM: the gate in hand is cut short, its runs end failed
            finally:
                await sink.aclose()  # its last events committed before the store closes
        await redis_async.aclose()
        redis_sync.close()

    async def _gate(
        self, store: Store, client: GovernedLLMClient, wait: BreakerWait, gate_id: str, n: int
    ) -> None:
        pool = demo_pool()
        prompts = (
            BASELINES[self.rng.randrange(len(BASELINES))],
            CANDIDATES[self.rng.randrange(len(CANDIDATES))],
        )
        snapshots = tuple(snapshot(self.endpoint, p, PARAMS["max_tokens"]) for p in prompts)
        salts = (f"baseline:{snapshots[0]}", f"soak:{gate_id}")
        limiter = asyncio.Semaphore(CONCURRENCY)
        units = self.rng.sample(pool.units(), self.cfg.units)
        with (
            RunLog(
                store, f"{gate_id}-b", config=_config(prompts[0], salts[0]), batch_size=10
            ) as base_log,
            RunLog(
                store, f"{gate_id}-c", config=_config(prompts[1], salts[1]), batch_size=10
            ) as cand_log,
        ):
            arms = [
                DemoArm(client, pool, p.text, salt, log, limiter, wait, dict(PARAMS))
                for p, salt, log in zip(prompts, salts, (base_log, cand_log), strict=True)
            ]
            gate = Gate(store, alpha=0.05, beta=0.2, p1=0.6, block_size=self.cfg.block_size)
            await gate.run(
                gate_id,
                units,
                baseline=Arm(snapshots[0], arms[0].evaluate),
                candidate=Arm(snapshots[1], arms[1].evaluate),
                seed=n,
            )


def _config(prompt: Prompt, salt: str) -> dict[str, Any]:
    """What the checker needs to rebuild every cache key this run could have written."""
    return {"system": prompt.text, "cache_salt": salt, "prompt_version": prompt.version}


def follow(cfg: SoakConfig) -> None:
    """Record every position seen, in order, until the file `follow-until` names the head."""
    work = Path(cfg.workdir)
    seen = LineLog(work / "follower.jsonl")
    until = work / "follow-until"
    with open_store(cfg.store_url, read_only=True, projections={}) as store:
        last = 0
        while True:
            for event in store.read_all(after_position=last, batch_size=200):
                seen.write({"pos": event.position})
                last = event.position
            if until.exists() and last >= int(until.read_text() or 0):
                return
            time.sleep(0.05)


def main(argv: Sequence[str]) -> None:
    faulthandler.enable(all_threads=True)  # a crash prints every thread's stack to stderr
    mode, config, *rest = argv
    cfg = SoakConfig.load(config)
    if mode == "worker":
        asyncio.run(Worker(cfg, int(rest[0]), int(rest[1])).run())
    elif mode == "follow":
        follow(cfg)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
