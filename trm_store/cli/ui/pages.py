"""What each page of `trm ui` shows, as data: the JSON API returns it, the HTML templates draw it.

One function per page, each built from the domain's query functions (the same ones `trm runs`,
`trm gate-report` and `trm llm-stats` use), so the browser, the API and the terminal can never
disagree. Everything here reads projections (paginated where a table can grow), never the log.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from trm_store.cli.ui.charts import line_chart
from trm_store.domain.browse import (
    final_metrics,
    list_workspaces,
    predictions_page,
    run_totals,
)
from trm_store.domain.diagnosis import read_diagnoses
from trm_store.domain.gate_report import read_gate_report
from trm_store.domain.gates import gate_info, list_gates
from trm_store.domain.llm_calls import breaker_transitions, llm_sources, llm_stats
from trm_store.domain.run_list import list_runs, run_statuses
from trm_store.domain.runs import run_info
from trm_store.domain.workspace import get_manifest
from trm_store.store import Store

__all__ = [
    "gate_page",
    "gates_page",
    "llm_page",
    "llm_source_page",
    "overview_page",
    "projections_page",
    "run_page",
    "runs_page",
    "workspace_page",
]

UNCERTAIN_TIER = "uncertain"


def _now() -> datetime:
    return datetime.now(UTC)


def overview_page(store: Store) -> dict[str, Any]:
    """The front page: every workspace, the latest runs and gates, the LLM sources."""
    return {
        "workspaces": list_workspaces(store),
        "runs": list_runs(store, now=_now(), newest=20)[::-1],
        "gates": list_gates(store)[:20],
        "llm_sources": llm_sources(store),
        "head": store.head_position(),
    }


def workspace_page(store: Store, workspace_id: str) -> dict[str, Any]:
    """A workspace: its manifest, its runs by epoch with their status and gate verdict, the
    `final` dual metrics over epochs (a chart per pool and arm), its best version."""
    manifest = get_manifest(store, workspace_id)
    gates = {g["gate_id"]: g for g in list_gates(store)}
    statuses = run_statuses(store, [r["run_id"] for r in manifest["runs"]])
    epochs: dict[str, list[dict[str, Any]]] = {}
    arms: dict[str, str] = {}
    for recorded in manifest["runs"]:
        run_id = recorded["run_id"]
        arms[run_id] = str(recorded.get("arm", run_id))
        gate = gates.get(str(recorded.get("gate_id")))
        epochs.setdefault(str(recorded.get("epoch", "-")), []).append(
            {
                "run_id": run_id,
                "arm": recorded.get("arm"),
                "status": statuses.get(run_id, "unknown"),  # a dangling id: shown, not followed
                "gate_id": None if gate is None else gate["gate_id"],
                "verdict": None if gate is None else gate["verdict"],
            }
        )
    finals: dict[str, list[tuple[float, float]]] = {}
    known = [run_id for run_id in arms if run_id in statuses]
    for metric in final_metrics(store, known):
        label = f"{metric['pool']} · {arms[metric['run_id']]}"
        finals.setdefault(label, []).append((metric["epoch"], metric["hard_acc"]))
    finals = {label: sorted(points) for label, points in finals.items()}
    fields = {k: v for k, v in manifest.items() if k not in ("runs", "best", "workspace_id")}
    return {
        "workspace_id": workspace_id,
        "fields": fields,
        "best": manifest["best"],
        "epochs": [{"epoch": epoch, "runs": runs} for epoch, runs in epochs.items()],
        "final_metrics": finals,
        "chart": line_chart(finals) if finals else None,
    }


def runs_page(store: Store) -> dict[str, Any]:
    """Every run, newest first, with status, lease age and predictions count."""
    return {"runs": list_runs(store, now=_now())[::-1]}


def run_page(store: Store, run_id: str, **page: Any) -> dict[str, Any]:
    """A run: status, lease, totals (accuracy, INFRA), its diagnoses by tier, and one page of
    its predictions (`page`: the filters and sort of `predictions_page`)."""
    info = run_info(store, run_id)
    heartbeat = info["heartbeat_at"]
    diagnoses = read_diagnoses(store, run_id)
    tiers = Counter(d["tier"] for d in diagnoses.values())
    return {
        "run": info,
        "lease_age_s": None
        if heartbeat is None
        else round((_now() - heartbeat).total_seconds(), 3),
        "totals": run_totals(store, run_id),
        "diagnoses": {
            "count": len(diagnoses),
            "tiers": dict(sorted(tiers.items())),
            "uncertain": tiers.get(UNCERTAIN_TIER, 0),
        },
        "predictions": predictions_page(store, run_id, **page),
    }


def gates_page(store: Store) -> dict[str, Any]:
    """Every gate, most recently started first."""
    return {"gates": list_gates(store)}


def gate_page(store: Store, gate_id: str) -> dict[str, Any]:
    """A gate: its report (blocks, W/L/ties, INFRA per arm, cache hits, decision), its status,
    and the E+ / E- path against log(1/alpha) and log(1/beta) as a chart."""
    report = read_gate_report(store, gate_id)
    info = gate_info(store, gate_id)
    config = report["config"]
    blocks = report["blocks"]
    chart = line_chart(
        {
            "log E+": [(b["block"], b["log_e_value"]) for b in blocks],
            "log E-": [(b["block"], b["log_futility_e_value"]) for b in blocks],
        },
        thresholds={
            "log(1/alpha)": -math.log(config["alpha"]),
            "log(1/beta)": -math.log(config["beta"]),
        },
    )
    return {"report": report, "status": info["status"], "reason": info["reason"], "chart": chart}


def llm_page(store: Store) -> dict[str, Any]:
    """Every LLM source with its figures (`llm_stats`)."""
    return {"sources": llm_stats(store)}


def llm_source_page(store: Store, source: str) -> dict[str, Any]:
    """One LLM source: its figures and its breaker's transitions in order (a timeline)."""
    stats = llm_stats(store, source=source)[source]
    return {
        "source": source,
        "stats": stats,
        "breaker": breaker_transitions(store, source=source),
    }


def projections_page(store: Store) -> dict[str, Any]:
    """Each projection's version, checkpoint against the log's head, and status: the head read
    with the rows, in one snapshot (`ProjectionStatus.head`), so no row is ever ahead of it."""
    rows = sorted(store.projection_status().values(), key=lambda s: s.name)
    return {
        "head": rows[0].head if rows else store.head_position(),
        "projections": [
            {
                "name": s.name,
                "version": s.version,
                "checkpoint": s.checkpoint,
                "behind": s.head - s.checkpoint,
                "status": s.status,
            }
            for s in rows
        ],
    }
