"""The demo run as one JSON document (`trm demo --json`), and the lines the report shares with it.

Every figure is read back from the event log (`DemoOutcome`); e-values that overflow a float are
null (`json_e_value`), so the document stays valid JSON.
"""

from __future__ import annotations

import shlex
from typing import Any

from trm_gate import to_e_value
from trm_store.cli.common import json_e_value
from trm_store.cli.demo.cause import InfraCause, infra_cause
from trm_store.cli.demo.outcome import DemoOutcome
from trm_store.domain.llm_calls import LLMSourceStats, SaltCalls, no_tokens

__all__ = ["TRUNCATIONS", "cause_of", "commands", "salt_calls", "summary", "truncations", "why"]

TRUNCATIONS = ("truncated_no_done", "stall_inter_token")
"""Failed-attempt reasons of a stream that ended or stalled mid-answer."""


def why(outcome: DemoOutcome) -> str:
    """The verdict's reason, with both thresholds when neither was reached."""
    r, config = outcome.result, outcome.report["config"]
    if r.verdict != "inconclusive":
        return r.reason
    return (
        f"{r.reason}: E+ = {r.e_value:.3g} < 1/alpha = {1 / config['alpha']:g} and "
        f"E- = {r.futility_e_value:.3g} < 1/beta = {1 / config['beta']:g}"
    )


def cause_of(outcome: DemoOutcome) -> InfraCause | None:
    """Why the gate ended `infra_abort` (None for any other verdict)."""
    if outcome.result.verdict != "infra_abort":
        return None
    return infra_cause(outcome.calls, outcome.baseline, outcome.candidate)


def _tokens(outcome: DemoOutcome) -> dict[str, Any]:
    arms = {r["arm"] or r["run_id"]: r["tokens"] for r in outcome.tokens["runs"]}
    return {"gate": outcome.tokens["total"], "arms": arms}


def commands(outcome: DemoOutcome) -> list[str]:
    """The commands that show what the run recorded."""
    db = shlex.quote(outcome.store_url)
    return [
        f"trm gate-report {shlex.quote(outcome.result.gate_id)} --db {db}",
        f"trm replay-projections --verify --db {db}",
        f"trm llm-stats --source {shlex.quote(outcome.endpoint.model)} "
        f"--gate {shlex.quote(outcome.result.gate_id)} --db {db}",
    ]


def salt_calls(calls: LLMSourceStats, salt: str) -> SaltCalls:
    """The calls asked with `salt` (an arm's), zeros if none."""
    zeros: SaltCalls = {"calls": 0, "cache_hits": 0, "failed": 0, "tokens": no_tokens()}
    return calls["by_salt"].get(salt, zeros)


def truncations(calls: LLMSourceStats) -> int:
    """Streams that ended or stalled mid-answer, caught."""
    return sum(calls["attempt_reasons"].get(k, 0) for k in TRUNCATIONS)


def summary(outcome: DemoOutcome) -> dict[str, Any]:
    """The run as one JSON-ready document."""
    r, calls, report = outcome.result, outcome.calls, outcome.report
    cause = cause_of(outcome)
    return {
        "verdict": r.verdict,
        "reason": why(outcome),
        "infra_cause": None
        if cause is None
        else {
            "kind": cause.kind,
            "text": cause.text,
            "try": cause.hint,
            "counts": cause.counts,
            "last_error": cause.last_error,
        },
        "gate_id": r.gate_id,
        "workspace": outcome.workspace,
        "epoch": outcome.epoch,
        "endpoint": {
            "base_url": outcome.endpoint.base_url,
            "model": outcome.endpoint.model,
            "simulated": outcome.endpoint.simulated,
            "served_at": outcome.endpoint.served_at,
        },
        "config": report["config"],
        "pool": {"units": report["pool_size"], "questions": outcome.pool_questions},
        "wins": r.wins,
        "losses": r.losses,
        "ties": r.ties,
        "e_value": json_e_value(r.e_value),
        "futility_e_value": json_e_value(r.futility_e_value),
        "units_evaluated": r.units_evaluated,
        "blocks": [
            {k: b[k] for k in ("block", "units", "wins", "losses", "ties", "decision")}
            | {
                "infra_baseline": b["infra_baseline"],
                "infra_candidate": b["infra_candidate"],
                "baseline_cache_hits": b["baseline_cache_hits"],
                "e_value": json_e_value(to_e_value(b["log_e_value"])),
                "futility_e_value": json_e_value(to_e_value(b["log_futility_e_value"])),
            }
            for b in report["blocks"]
        ],
        "infra_units": {"baseline": r.infra_units_baseline, "candidate": r.infra_units_candidate},
        "arms": {
            name: {
                "run_id": arm.run_id,
                "prompt_version": arm.prompt.version,
                "hints": list(arm.prompt.hints),
                "snapshot": arm.snapshot,
                "cache_salt": arm.salt,
                "units_evaluated_now": len(arm.units),
                "questions_asked": arm.questions,
                "stop_reasons": arm.stops,
                "calls": salt_calls(calls, arm.salt)["calls"],
                "response_cache_hits": salt_calls(calls, arm.salt)["cache_hits"],
                "requeued_after_breaker": arm.requeued,
            }
            for name, arm in (("baseline", outcome.baseline), ("candidate", outcome.candidate))
        },
        "baseline_cache": {
            "snapshot": outcome.baseline.snapshot,
            "hits": r.baseline_cache_hits,
            "units": r.units_evaluated,
            "evaluated_now": len(outcome.baseline.units),
            "cached_now": outcome.baseline_cached,
        },
        "calls": {
            "total": calls["calls"],
            "completed": calls["completed"],
            "failed": calls["failed"],
            "failed_by_error": calls["errors"],
            "response_cache_hits": calls["cache_hits"],
            "retries": calls["retries"],
            "failed_attempts_by_reason": calls["attempt_reasons"],
            "truncations_caught": truncations(calls),
            "tokens_discarded": calls["tokens_discarded"],
            "overload_retries": calls["overload_retries"],
        },
        "concurrency_limit": calls["limit"],
        "tokens": _tokens(outcome),
        "breaker_transitions": [
            {k: t[k] for k in ("from_state", "to_state", "failures")} for t in outcome.breaker
        ],
        "faults_injected": outcome.injected,
        "events": {
            "store": outcome.store_url,
            "response_cache": str(outcome.cache_path),
            "new_events": outcome.events,
            "streams": outcome.streams,
            "commands": commands(outcome),
        },
        "elapsed_s": round(outcome.elapsed_s, 2),
    }
