"""`run_demo`: one gated epoch end to end, the way a harness would wire trm.

Store (SQLite by default) -> workspace manifest (scaffolded once; the epoch counter lives there)
-> endpoint (a real OpenAI-compatible one, or the simulated model on loopback with faults) ->
governed client, arms and gate (`wiring.EpochRun`) -> the epoch's outcome in the workspace -> the
summary, read back from the events (`read_gate_report`, `llm_stats`).

The candidate's salt is fresh per epoch (`{workspace}:{token}:e{n}`, the token drawn when the
workspace is scaffolded, so a deleted store never meets its old cache). The demo keeps its
baseline fixed across epochs (a real loop would promote an accepted candidate), so a second run
shows the baseline cache at work.

`--resume` continues the workspace's last gate after a crash or Ctrl-C (`Gate.resume`): same
epoch, salt and seed (so the same unit order and candidate prompt), new runs for the arms
(`{gate}-baseline-r1`, ...), the gate's recorded blocks replayed, not asked again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from trm_gate import GateNotResumableError, GateProgress
from trm_store.bootstrap import open_store
from trm_store.cli.demo.faults import FaultPlan
from trm_store.cli.demo.model import SimulatedModel
from trm_store.cli.demo.outcome import DemoOptions, DemoOutcome, Endpoint
from trm_store.cli.demo.pool import POOL_VERSION, demo_pool
from trm_store.cli.demo.prompts import Prompt, baseline_prompt, candidate_prompt
from trm_store.cli.demo.server import SIMULATED_BASE_URL, DemoServer, loopback_http
from trm_store.cli.demo.wiring import WORKSPACE, EpochRun
from trm_store.domain.errors import UnknownWorkspaceError
from trm_store.domain.gate_leases import takeover_problem
from trm_store.domain.gate_report import read_gate_report
from trm_store.domain.gates import RESUMED, gate_stream
from trm_store.domain.llm_calls import breaker_transitions, llm_stats, token_totals
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


def _resumable(
    store: Store, manifest: dict[str, Any], options: DemoOptions
) -> tuple[str, int, int, DemoOptions]:
    """The workspace's last gate, if it can be resumed: (gate id, its epoch, the attempt, the
    options with the gate's seed); GateNotResumableError (nothing written) if not."""
    gate_id = manifest.get("last_gate")
    if not isinstance(gate_id, str):
        raise GateNotResumableError("the demo's workspace has no gate to resume")
    problem, _, _ = takeover_problem(store, gate_id)
    if problem is not None:
        raise GateNotResumableError(f"gate {gate_id!r} cannot be resumed: {problem}")
    events = store.read_stream(gate_stream(gate_id))
    attempt = 1 + sum(e.type == RESUMED for e in events)
    return gate_id, int(manifest["epoch"]), attempt, replace(options, seed=events[0].data["seed"])


async def run_demo(
    options: DemoOptions,
    *,
    on_answer: Callable[[], None] = lambda: None,
    on_block: Callable[[GateProgress], None] | None = None,
    resume: bool = False,
) -> DemoOutcome:
    """Run one gated epoch (see the module docstring); `on_answer` ticks once per question,
    `on_block` once per gate block (the gate's progress). `resume`: continue the workspace's
    last gate (interrupted: failed, or its process gone) instead, in its epoch, with its seed."""
    started = time.perf_counter()
    with open_store(options.db) as store:
        head = store.head_position()
        base = baseline_prompt()
        manifest = _workspace(store, base)
        if resume:
            gate_id, epoch, attempt, options = _resumable(store, manifest, options)
        else:
            epoch, attempt = int(manifest.get("epoch", 0)) + 1, 0
            gate_id = f"demo-e{epoch}-{uuid.uuid4().hex[:6]}"
            update_manifest(store, WORKSPACE, epoch=epoch, last_gate=gate_id)
        cand = candidate_prompt(options.seed)
        with _endpoint(options, epoch) as (endpoint, server):
            salt = f"{WORKSPACE}:{manifest['salt_token']}:e{epoch}"
            prompts = (base, cand)
            epoch_run = EpochRun(store, options, endpoint, prompts, epoch, gate_id, salt, attempt)
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
            tokens=token_totals(store, gate_id=gate_id),
            breaker=breaker_transitions(store, source=endpoint.model, after=head),
            injected=injected,
            events=store.head_position() - head,
            elapsed_s=time.perf_counter() - started,
        )
