"""`run_demo`: one gated epoch end to end, the way a harness would wire trm.

Store (SQLite by default) -> workspace manifest (scaffolded once; the epoch counter lives there)
-> endpoint (a real OpenAI-compatible one, or the simulated model on loopback with faults) ->
governed client, arms and gate (`wiring.EpochRun`) -> the epoch's outcome in the workspace -> the
summary, read back from the events (`read_gate_report`, `llm_stats`).

The candidate's salt is fresh per epoch (`{workspace}:{token}:e{n}`, the token drawn when the
workspace is scaffolded, so a deleted store never meets its old cache). The demo keeps its
baseline fixed across epochs (a real loop would promote an accepted candidate), so a second run
shows the baseline cache at work.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from trm_gate import GateProgress
from trm_store.bootstrap import open_store
from trm_store.cli.demo.faults import FaultPlan
from trm_store.cli.demo.model import SimulatedModel
from trm_store.cli.demo.outcome import DemoOptions, DemoOutcome, Endpoint
from trm_store.cli.demo.pool import POOL_VERSION, demo_pool
from trm_store.cli.demo.prompts import Prompt, baseline_prompt, candidate_prompt
from trm_store.cli.demo.server import SIMULATED_BASE_URL, DemoServer, loopback_http
from trm_store.cli.demo.wiring import WORKSPACE, EpochRun
from trm_store.domain.errors import UnknownWorkspaceError
from trm_store.domain.gate_report import read_gate_report
from trm_store.domain.llm_calls import breaker_transitions, llm_stats
from trm_store.domain.workspace import get_manifest, scaffold_workspace, update_manifest
from trm_store.store import Store

__all__ = ["run_demo"]

SIM_STALL_S = 1.5  # the simulated server's stalls; its client gives up on silence much sooner


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
    options: DemoOptions,
    *,
    on_answer: Callable[[], None] = lambda: None,
    on_block: Callable[[GateProgress], None] | None = None,
) -> DemoOutcome:
    """Run one gated epoch (see the module docstring); `on_answer` ticks once per question,
    `on_block` once per gate block (the gate's progress)."""
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
            epoch_run = EpochRun(store, options, endpoint, (base, cand), epoch, gate_id, salt)
            http = None if server is None else loopback_http(server)
            try:
                result, arms = await epoch_run.run(on_answer, http, on_block)
            finally:
                if http is not None:
                    await http.aclose()
        injected = dict(server.injected) if server is not None else None
        metric = epoch_run.record(result)
        cached = store.read_stream(f"baseline:{epoch_run.snapshots[0]}")
        return DemoOutcome(
            result=result,
            report=read_gate_report(store, gate_id),
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
            calls=llm_stats(store, source=endpoint.model, after=head)[endpoint.model],
            breaker=breaker_transitions(store, source=endpoint.model, after=head),
            injected=injected,
            events=store.head_position() - head,
            elapsed_s=time.perf_counter() - started,
        )
