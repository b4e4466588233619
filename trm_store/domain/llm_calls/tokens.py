"""Token totals: the usage servers reported, per source and salt (`llm_stats` adds them up
with `add_tokens`) and per run, per arm and per gate (`token_totals`).

Only answers a server sent count (a cache hit spent nothing). A run's calls are the ones its
predictions name (`call_id` in a prediction's fields, as the demo records it); a gate's runs are
the runs whose config names it (`gate_id`), each an arm (`arm` in the config).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from sqlalchemy import select

from trm_store.domain._common import check_id

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["RunTokens", "TokenTotals", "Tokens", "add_tokens", "no_tokens", "token_totals"]

_CHUNK = 500  # call ids per IN (...) query


class Tokens(TypedDict):
    """`calls`: answers sent by the server that reported usage; `total`: their total_tokens
    (prompt + completion where a server gave no total)."""

    calls: int
    prompt: int
    completion: int
    total: int


class RunTokens(TypedDict):
    """One run's tokens: `arm` from its config (None if it names none)."""

    run_id: str
    arm: str | None
    tokens: Tokens


class TokenTotals(TypedDict):
    """Per run (each an arm) and in all (the gate's, when asked for a gate)."""

    gate_id: str | None
    runs: list[RunTokens]
    total: Tokens


def no_tokens() -> Tokens:
    """Zero tokens, to add to."""
    return {"calls": 0, "prompt": 0, "completion": 0, "total": 0}


def add_tokens(tokens: Tokens, row: Any) -> None:
    """Add one `llm_calls` row's usage to `tokens`, if the server sent it (a hit spent none)."""
    if row.cache_hit or row.outcome != "completed":
        return
    prompt, completion, total = row.prompt_tokens, row.completion_tokens, row.total_tokens
    if prompt is None and completion is None and total is None:
        return
    tokens["calls"] += 1
    tokens["prompt"] += prompt or 0
    tokens["completion"] += completion or 0
    tokens["total"] += total if total is not None else (prompt or 0) + (completion or 0)


def token_totals(
    store: Store, *, gate_id: str | None = None, run_ids: Sequence[str] = ()
) -> TokenTotals:
    """The tokens of `run_ids`, and of every run whose config names `gate_id`; runs in the order
    given, then the gate's in registration order. An unknown run or gate raises
    `UnknownRunError` / `UnknownGateError`."""
    from trm_store.domain.gates import gate_info
    from trm_store.domain.runs import read_predictions, run_info

    runs = [check_id("run_id", r) for r in run_ids]
    if gate_id is not None:
        gate_info(store, gate_id)  # it exists
        runs += [r for r in _gate_runs(store, gate_id) if r not in runs]
    named: dict[str, list[str]] = {}
    arms: dict[str, str | None] = {}
    for run_id in runs:
        config = run_info(store, run_id)["config"] or {}
        arm = config.get("arm")
        arms[run_id] = arm if isinstance(arm, str) else None
        calls = (p.get("call_id") for p in read_predictions(store, run_id))
        named[run_id] = [c for c in calls if isinstance(c, str)]
    by_call = _call_tokens(store, {c for ids in named.values() for c in ids})
    total = no_tokens()
    per_run: list[RunTokens] = []
    for run_id in runs:
        tokens = no_tokens()
        for call_id in dict.fromkeys(named[run_id]):  # a call named twice counts once
            row = by_call.get(call_id)
            if row is not None:
                add_tokens(tokens, row)
                add_tokens(total, row)
        per_run.append({"run_id": run_id, "arm": arms[run_id], "tokens": tokens})
    return {"gate_id": gate_id, "runs": per_run, "total": total}


def _gate_runs(store: Store, gate_id: str) -> list[str]:
    from trm_store.domain.runs import PROJECTION as RUNS

    with store.query(RUNS) as (conn, tables):
        runs = tables["runs"]
        rows = conn.execute(
            select(runs.c.run_id, runs.c.config).order_by(runs.c.started_at, runs.c.run_id)
        )
        return [
            r.run_id
            for r in rows
            if isinstance(r.config, dict) and r.config.get("gate_id") == gate_id
        ]


def _call_tokens(store: Store, call_ids: set[str]) -> dict[str, Any]:
    from trm_store.domain.llm_calls.projection import PROJECTION

    ordered = sorted(call_ids)
    found: dict[str, Any] = {}
    with store.query(PROJECTION) as (conn, tables):
        calls = tables["calls"]
        columns = ("call_id", "cache_hit", "outcome", "prompt_tokens", "completion_tokens")
        cols = [calls.c[name] for name in (*columns, "total_tokens")]
        for i in range(0, len(ordered), _CHUNK):
            query = select(*cols).where(calls.c.call_id.in_(ordered[i : i + _CHUNK]))
            found.update((row.call_id, row) for row in conn.execute(query))
    return found
