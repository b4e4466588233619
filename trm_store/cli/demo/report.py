"""The demo's output: a rich report for people, or one JSON document (`--json`) for scripts."""

from __future__ import annotations

import math
import shlex
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trm_store.cli.demo.outcome import DemoOutcome

__all__ = ["print_report", "summary"]

_BAR = 20
_PATH_MAX = 9  # breaker states shown before the path is elided
_TRUNCATIONS = ("truncated_no_done", "stall_inter_token")
_COLOUR = {"accept": "green", "reject": "red", "inconclusive": "yellow", "infra_abort": "red"}


def _e(log_value: float) -> float:
    return math.exp(min(log_value, 700.0))


def _why(outcome: DemoOutcome) -> str:
    """The verdict's reason, with both thresholds when neither was reached."""
    r, config = outcome.result, outcome.report["config"]
    if r.verdict != "inconclusive":
        return r.reason
    return (
        f"{r.reason}: E+ = {r.e_value:.3g} < 1/alpha = {1 / config['alpha']:g} and "
        f"E- = {r.futility_e_value:.3g} < 1/beta = {1 / config['beta']:g}"
    )


def _commands(outcome: DemoOutcome) -> list[str]:
    db = shlex.quote(outcome.store_url)
    return [
        f"trm gate-report {shlex.quote(outcome.result.gate_id)} --db {db}",
        f"trm replay-projections --verify --db {db}",
        f"trm llm-stats --source {shlex.quote(outcome.endpoint.model)} --db {db}",
    ]


def _baseline_cache_line(outcome: DemoOutcome) -> str:
    r, base = outcome.result, outcome.baseline
    line = (
        f"{r.baseline_cache_hits} of {r.units_evaluated} units from the baseline cache "
        f"(snapshot {escape(base.snapshot)})"
    )
    if base.units:
        line += (
            f"; {len(base.units)} evaluated now (new to the cache, or INFRA last time and so "
            f"never cached), {outcome.baseline_cached} of them cached for the next run"
        )
    return line


def summary(outcome: DemoOutcome) -> dict[str, Any]:
    """The run as one JSON-ready document."""
    r, calls = outcome.result, outcome.calls
    return {
        "verdict": r.verdict,
        "reason": _why(outcome),
        "gate_id": r.gate_id,
        "workspace": outcome.workspace,
        "epoch": outcome.epoch,
        "endpoint": {
            "base_url": outcome.endpoint.base_url,
            "model": outcome.endpoint.model,
            "simulated": outcome.endpoint.simulated,
            "served_at": outcome.endpoint.served_at,
        },
        "config": outcome.report["config"],
        "pool": {"units": outcome.report["pool_size"], "questions": outcome.pool_questions},
        "wins": r.wins,
        "losses": r.losses,
        "ties": r.ties,
        "e_value": r.e_value,
        "futility_e_value": r.futility_e_value,
        "units_evaluated": r.units_evaluated,
        "blocks": [
            {k: b[k] for k in ("block", "units", "wins", "losses", "ties", "decision")}
            | {
                "infra_baseline": b["infra_baseline"],
                "infra_candidate": b["infra_candidate"],
                "baseline_cache_hits": b["baseline_cache_hits"],
                "e_value": _e(b["log_e_value"]),
                "futility_e_value": _e(b["log_futility_e_value"]),
            }
            for b in outcome.report["blocks"]
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
                "calls": calls.arm(arm.salt).calls,
                "response_cache_hits": calls.arm(arm.salt).cache_hits,
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
            "total": calls.calls,
            "completed": calls.completed,
            "failed": calls.failed,
            "failed_by_error": dict(calls.errors),
            "response_cache_hits": calls.cache_hits,
            "retries": calls.retries,
            "failed_attempts_by_reason": dict(calls.failed_attempts),
            "truncations_caught": sum(calls.failed_attempts[k] for k in _TRUNCATIONS),
            "tokens_discarded": calls.tokens_discarded,
        },
        "breaker_transitions": [
            {k: t[k] for k in ("from_state", "to_state", "failures")} for t in calls.breaker
        ],
        "faults_injected": outcome.injected,
        "events": {
            "store": outcome.store_url,
            "response_cache": str(outcome.cache_path),
            "new_events": outcome.events,
            "streams": outcome.streams,
            "commands": _commands(outcome),
        },
        "elapsed_s": round(outcome.elapsed_s, 2),
    }


def print_report(console: Console, outcome: DemoOutcome) -> None:
    """The run for people: setup, blocks and e-value path, verdict, governance, where to look."""
    r = outcome.result
    console.print(
        f"[bold]trm demo[/] · epoch {outcome.epoch} of workspace {outcome.workspace} · "
        f"gate {r.gate_id}"
    )
    console.print(_grid(_setup(outcome)))
    console.print(_blocks(outcome))
    console.print(_grid(_verdict(outcome) + _governance(outcome) + _where(outcome)))
    console.print("[bold]look at them[/]")
    for command in _commands(outcome):  # never wrapped: they are for copying
        console.print(f"  {escape(command)}", soft_wrap=True)
    console.print(f"took {outcome.elapsed_s:.1f} s")


def _grid(rows: list[tuple[str, str]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in rows:
        grid.add_row(key, value)
    return grid


def _setup(outcome: DemoOutcome) -> list[tuple[str, str]]:
    ep, config = outcome.endpoint, outcome.report["config"]
    if ep.simulated:
        where = [
            (
                "endpoint",
                f"[bold yellow]SIMULATED[/] model {ep.model}, not a real LLM: "
                f"trm_llm.simulated_server on {ep.served_at}, injecting faults on purpose "
                "(truncated streams, resets, 429 + Retry-After, stalls, error payloads, 500s, "
                "a few 400s, one 503 outage)",
            )
        ]
    else:
        where = [("endpoint", escape(f"{ep.base_url}, model {ep.model}"))]
    base, cand = outcome.baseline.prompt, outcome.candidate.prompt
    return [
        *where,
        (
            "gate",
            f"pool of {outcome.report['pool_size']} units ({outcome.pool_questions} questions), "
            f"blocks of {config['block_size']}; alpha {config['alpha']}, beta {config['beta']}, "
            f"p1 {config['p1']}",
        ),
        ("baseline", escape(f"{base.version} {base.text!r}")),
        ("candidate", f"{cand.version} = baseline + hints: {', '.join(cand.hints)}"),
    ]


def _blocks(outcome: DemoOutcome) -> Table:
    config = outcome.report["config"]
    log_a = -math.log(config["alpha"])
    table = Table(title="blocks (E+ path towards 1/alpha)", title_justify="left")
    for name in ("block", "units", "W", "L", "ties", "INFRA b", "INFRA c", "b-cache", "E+", "E-"):
        table.add_column(name, justify="right")
    table.add_column(f"E+ -> {1 / config['alpha']:g}")
    table.add_column("decision")
    for b in outcome.report["blocks"]:
        filled = min(_BAR, math.floor(_BAR * max(0.0, b["log_e_value"] / log_a)))
        table.add_row(
            *(str(b[k]) for k in ("block", "units", "wins", "losses", "ties")),
            *(str(b[k]) for k in ("infra_baseline", "infra_candidate", "baseline_cache_hits")),
            f"{_e(b['log_e_value']):.3g}",
            f"{_e(b['log_futility_e_value']):.3g}",
            "█" * filled + "·" * (_BAR - filled),
            b["decision"],
        )
    return table


def _verdict(outcome: DemoOutcome) -> list[tuple[str, str]]:
    r = outcome.result
    rows = [
        (
            "verdict",
            f"[bold {_COLOUR[r.verdict]}]{r.verdict.upper()}[/]: {_why(outcome)} after "
            f"{r.blocks} block(s), {r.units_evaluated} units",
        ),
        (
            "pairs",
            f"W {r.wins} / L {r.losses} / ties {r.ties}; INFRA units: baseline "
            f"{r.infra_units_baseline}, candidate {r.infra_units_candidate} (left out of the "
            "pairing, never cached)",
        ),
    ]
    if r.verdict == "infra_abort":
        last = outcome.candidate.last_error or outcome.baseline.last_error
        rows.append(
            (
                "",
                "[red]the endpoint failed too often to measure anything[/]"
                + (f"; last error: {escape(last)}" if last else ""),
            )
        )
    return rows


def _arm_line(outcome: DemoOutcome, name: str) -> str:
    arm = outcome.baseline if name == "baseline" else outcome.candidate
    stops = ", ".join(f"{k} {v}" for k, v in sorted(arm.stops.items())) or "none"
    return f"{arm.questions} questions asked ({stops}), run {escape(arm.run_id)}"


def _governance(outcome: DemoOutcome) -> list[tuple[str, str]]:
    calls, base, cand = outcome.calls, outcome.baseline, outcome.candidate
    errors = ", ".join(f"{k} {v}" for k, v in calls.errors.most_common()) or "none"
    reasons = ", ".join(f"{k} {v}" for k, v in calls.failed_attempts.most_common()) or "none"
    truncated = sum(calls.failed_attempts[k] for k in _TRUNCATIONS)
    rows = [
        ("baseline cache", _baseline_cache_line(outcome)),
        ("baseline arm", _arm_line(outcome, "baseline")),
        ("candidate arm", _arm_line(outcome, "candidate")),
        (
            "response cache",
            f"{calls.cache_hits} hits in {calls.calls} calls: baseline "
            f"{calls.arm(base.salt).cache_hits} (salt = its snapshot: a fixed reference), "
            f"candidate {calls.arm(cand.salt).cache_hits} (salt {escape(cand.salt)}: a fresh "
            f"sample every epoch); {escape(str(outcome.cache_path))}",
        ),
        (
            "calls",
            f"{calls.calls}: {calls.completed} completed, {calls.failed} failed ({errors}); "
            f"{base.requeued + cand.requeued} refused by the open breaker were asked again",
        ),
        ("retries", f"{calls.retries}; failed attempts by reason: {reasons}"),
        (
            "truncations",
            f"{truncated} streams that ended or stalled mid-answer were caught; "
            f"{calls.tokens_discarded} partial chunks discarded, none graded or cached",
        ),
        ("breaker", _breaker_path(calls.breaker)),
    ]
    if outcome.injected is not None:
        injected = ", ".join(f"{k} {v}" for k, v in sorted(outcome.injected.items())) or "none"
        rows.append(
            (
                "injected",
                f"{sum(outcome.injected.values())} faults ({injected}); the events record "
                f"{sum(calls.failed_attempts.values())} failed attempts",
            )
        )
    return rows


def _breaker_path(transitions: list[dict[str, Any]]) -> str:
    if not transitions:
        return "closed throughout"
    states = [transitions[0]["from_state"], *(t["to_state"] for t in transitions)]
    if len(states) <= _PATH_MAX:
        return " -> ".join(states)
    opened = sum(t["to_state"] == "open" for t in transitions)
    return (
        " -> ".join(states[: _PATH_MAX - 1])
        + f" -> ... -> {states[-1]} ({len(transitions)} transitions, opened {opened} times)"
    )


def _where(outcome: DemoOutcome) -> list[tuple[str, str]]:
    rows = [
        ("events", f"{outcome.events} new events in {outcome.store_url}"),
        ("streams", "  ".join(outcome.streams)),
    ]
    return [(key, escape(value)) for key, value in rows]
