"""The soak's checks, run once every worker has stopped: each returns its violations (empty when
the invariant held) and a few figures for the summary.

Probe check (at most one live probe lease at a time, across all processes): every worker writes
down each probe lease it was handed (`AuditedBreaker`), with the times just before and after the
Redis update, and each end it asked for with that lease's token (the probe's own outcome, or its
release), with the time just before the update. Only these end a lease (the client reports every
outcome with its admission), besides expiry. Probes sorted by the time after admission, each must
come after the previous probe's lease ended: the first end asked for with its token, or its expiry
(`probe_timeout_s` after its time before admission), whichever came first. An end is taken when
it was asked for, even if the worker never heard back (a reply that timed out may still have
been applied by Redis), so the check can miss a violation but never invent one. A probe admitted
earlier was a second probe out at once: a violation. A lease held by a killed worker ends by
expiry (the designed recovery), so the probe after it is no violation. A probe admitted while
its worker could not reach Redis (the breaker degraded to local state, as documented) holds no
shared lease: it is counted apart (`local_probes`) and not paired. `new_window` tells probes
that opened a half-open window (open -> half_open) from those admitted inside one after a
release or an expiry; the log's `llm.breaker_changed` events are counted beside them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import pairwise
from math import inf
from pathlib import Path
from typing import Any

import redis
from soak_common import PARAMS, SoakConfig, read_lines
from sqlalchemy import func, select

from trm_llm import build_cache_key
from trm_llm.cache import CorruptEntryError, decode_entry
from trm_store import INFRA_STOP_REASONS, Store, mark_stale_runs
from trm_store.cli.demo.model import SimulatedModel
from trm_store.cli.demo.pool import demo_pool
from trm_store.cli.demo.prompts import messages

__all__ = ["Findings", "check_all"]


@dataclass
class Findings:
    """Violations by check (an empty list: it held) and figures for the summary."""

    violations: dict[str, list[str]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)

    def add(self, check: str, problems: Iterable[str]) -> None:
        self.violations[check] = list(problems)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.violations.values())


def check_all(cfg: SoakConfig, store: Store, seed: int) -> Findings:
    """Every invariant of the soak, on the store and Redis it used."""
    work = Path(cfg.workdir)
    found = Findings()
    positions, types = _log(store, found)
    found.add("acknowledged events present", _acks(work, positions, found))
    found.add("follower saw 1..head in order", _follower(work, len(positions)))
    found.add("projections equal a rebuild", store.verify_projections())
    found.add("redis cache: complete answers only", _cache(cfg, store, seed, found))
    found.add("baseline cache: no INFRA unit", _baseline(store, found))
    found.add("one probe per half-open window", _probes(cfg, work, types, found))
    found.add("no run left running", _runs(store, found))
    found.figures["llm_calls"] = types["llm.call_completed"] + types["llm.call_failed"]
    found.figures["events"] = len(positions)
    found.figures["gates"] = types["gate.started"]
    found.figures["gates_decided"] = types["gate.decided"]
    return found


def _log(store: Store, found: Findings) -> tuple[dict[str, int], Counter[str]]:
    """event id -> position over the whole log; duplicate ids and position gaps are violations."""
    ids: dict[str, int] = {}
    types: Counter[str] = Counter()
    problems, expected = [], 1
    for event in store.read_all(batch_size=2000):
        if event.event_id in ids:
            problems.append(
                f"event id {event.event_id} at {ids[event.event_id]} and {event.position}"
            )
        if event.position != expected:
            problems.append(f"position {event.position} where {expected} was due")
        ids[event.event_id] = event.position
        types[event.type] += 1
        expected = event.position + 1
    if expected - 1 != store.head_position():
        problems.append(f"read up to {expected - 1}, head is {store.head_position()}")
    found.add("event ids unique, positions dense", problems)
    return ids, types


def _acks(work: Path, positions: dict[str, int], found: Findings) -> list[str]:
    acked = {(a["id"], a["pos"]) for a in read_lines(work, "acks-*.jsonl")}
    found.figures["acked"] = len(acked)
    missing = [
        f"acked {i} at {p}: in the log at {positions.get(i)}"
        for i, p in acked
        if positions.get(i) != p
    ]
    return missing[:20] + ([f"... {len(missing) - 20} more"] if len(missing) > 20 else [])


def _follower(work: Path, head: int) -> list[str]:
    seen = [r["pos"] for r in read_lines(work, "follower.jsonl")]
    if seen == list(range(1, head + 1)):
        return []
    first = next((i for i, p in enumerate(seen) if p != i + 1), len(seen))
    return [f"follower saw {len(seen)} positions, head {head}; first wrong at index {first}"]


def _cache(cfg: SoakConfig, store: Store, seed: int, found: Findings) -> list[str]:
    """Each entry decodes, finished with `stop`, and is the simulated model's whole answer to a
    request some run made (every key rebuilt from the runs' configs)."""
    model, pool = SimulatedModel(seed), demo_pool()
    expected: dict[str, str] = {}
    with store.query("runs") as (conn, tables):
        configs = [row.config for row in conn.execute(select(tables["runs"].c.config))]
    for config in {(c["system"], c["cache_salt"]) for c in configs}:
        system, salt = config
        for q in pool.questions:
            chat = messages(system, q.text)
            key = build_cache_key(cfg.model, chat, salt, PARAMS, endpoint=cfg.base_url)
            # the question is the last message (after the worked example)
            expected[key] = model.reply(system, chat[-1]["content"])
    problems, entries = [], 0
    client = redis.Redis.from_url(cfg.redis_url)
    try:
        for name in client.scan_iter(match=f"{cfg.cache_namespace}:*", count=1000):
            entries += 1
            key = name.decode().rsplit(":", 1)[1]
            try:
                entry = decode_entry(client.get(name) or b"")
            except CorruptEntryError as e:
                problems.append(f"{key[:12]}: does not decode ({e})")
                continue
            if entry.finish_reason != "stop":
                problems.append(f"{key[:12]}: finish_reason {entry.finish_reason!r}")
            elif key not in expected:
                problems.append(f"{key[:12]}: no run asked for it")
            elif entry.content != expected[key]:
                problems.append(f"{key[:12]}: not the whole answer ({entry.content[:40]!r})")
    finally:
        client.close()
    found.figures["cache_entries"] = entries
    return problems


def _baseline(store: Store, found: Findings) -> list[str]:
    problems, units = [], 0
    with store.query("baseline_cache") as (conn, tables):
        for row in conn.execute(select(tables["units"])):
            units += 1
            stops = {r["stop_reason"] for r in row.results}
            if stops & INFRA_STOP_REASONS:
                problems.append(f"{row.snapshot} {row.unit_id}: {sorted(stops)}")
    found.figures["baseline_units"] = units
    return problems


def _probes(cfg: SoakConfig, work: Path, types: Counter[str], found: Findings) -> list[str]:
    records = read_lines(work, "probes-*.jsonl")
    admitted = [r for r in records if r["k"] == "probe"]
    # A worker that lost Redis admits on its own local state (the documented degradation): such
    # a probe holds no shared lease, so it is counted apart, not paired with the shared ones.
    local = [r for r in admitted if r.get("local")]
    probes = sorted((r for r in admitted if not r.get("local")), key=lambda r: r["t1"])
    ends: dict[str, float] = {}
    for r in records:
        if r["k"] == "end":
            ends[r["tok"]] = min(r["t"], ends.get(r["tok"], inf))
    problems = []
    for previous, probe in pairwise(probes):
        end = min(ends.get(previous["tok"], inf), previous["t0"] + cfg.probe_timeout_s)
        if probe["t1"] < end:
            problems.append(
                f"probe {probe['tok'][:8]} admitted {end - probe['t1']:.3f}s before "
                f"probe {previous['tok'][:8]}'s lease ended"
            )
    found.figures["probes"] = len(probes)
    found.figures["local_probes"] = len(local)
    found.figures["half_open_windows"] = sum(p["new_window"] for p in probes)
    found.figures["breaker_events"] = types["llm.breaker_changed"]
    return problems


def _runs(store: Store, found: Findings) -> list[str]:
    """Killed workers' runs are marked stale (the designed recovery); then none is running."""
    found.figures["marked_stale"] = len(mark_stale_runs(store, timedelta(seconds=0.5)))
    with store.query("runs") as (conn, tables):
        runs = tables["runs"]
        running = conn.execute(
            select(func.count()).select_from(runs).where(runs.c.status == "running")
        ).scalar_one()
        found.figures["runs"] = conn.execute(select(func.count()).select_from(runs)).scalar_one()
    return [f"{running} run(s) still running after mark_stale_runs"] if running else []
