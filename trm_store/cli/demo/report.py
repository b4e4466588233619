"""The demo run for people: a rich report of the setup, the blocks and e-value path, the
verdict, what the governance did and where to look (`trm demo`; `--json` is `summary`)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trm_gate import to_e_value
from trm_store.cli.common import counts_text
from trm_store.cli.demo.outcome import DemoOutcome
from trm_store.cli.demo.summary import cause_of, commands, salt_calls, truncations, why
from trm_store.domain.llm_calls import LimitStats, Tokens

__all__ = ["print_report"]

_BAR = 20
_PATH_MAX = 9  # breaker states shown before the path is elided
_COLOUR = {"accept": "green", "reject": "red", "inconclusive": "yellow", "infra_abort": "red"}


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
    for command in commands(outcome):  # never wrapped: they are for copying
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
            f"{to_e_value(b['log_e_value']):.3g}",
            f"{to_e_value(b['log_futility_e_value']):.3g}",
            "█" * filled + "·" * (_BAR - filled),
            b["decision"],
        )
    return table


def _verdict(outcome: DemoOutcome) -> list[tuple[str, str]]:
    r = outcome.result
    rows = [
        (
            "verdict",
            f"[bold {_COLOUR[r.verdict]}]{r.verdict.upper()}[/]: {why(outcome)} after "
            f"{r.blocks} block(s), {r.units_evaluated} units",
        ),
        (
            "pairs",
            f"W {r.wins} / L {r.losses} / ties {r.ties}; INFRA units: baseline "
            f"{r.infra_units_baseline}, candidate {r.infra_units_candidate} (left out of the "
            "pairing, never cached)",
        ),
    ]
    cause = cause_of(outcome)
    if cause is not None:
        rows.append(("why", f"[red]{cause.kind}[/]: {escape(cause.text)}"))
        rows.append(("try", escape(cause.hint)))
        if cause.last_error:
            rows.append(("last error", escape(cause.last_error)))
    return rows


def _arm_line(outcome: DemoOutcome, name: str) -> str:
    arm = outcome.baseline if name == "baseline" else outcome.candidate
    stops = counts_text(arm.stops) or "none"
    return f"{arm.questions} questions asked ({stops}), run {escape(arm.run_id)}"


def _governance(outcome: DemoOutcome) -> list[tuple[str, str]]:
    calls, base, cand = outcome.calls, outcome.baseline, outcome.candidate
    errors = counts_text(calls["errors"], most_first=True) or "none"
    reasons = counts_text(calls["attempt_reasons"], most_first=True) or "none"
    base_hits, cand_hits = (salt_calls(calls, arm.salt)["cache_hits"] for arm in (base, cand))
    rows = [
        ("baseline cache", _baseline_cache_line(outcome)),
        ("baseline arm", _arm_line(outcome, "baseline")),
        ("candidate arm", _arm_line(outcome, "candidate")),
        (
            "response cache",
            f"{calls['cache_hits']} hits in {calls['calls']} calls: baseline "
            f"{base_hits} (salt = its snapshot: a fixed reference), "
            f"candidate {cand_hits} (salt {escape(cand.salt)}: a fresh "
            f"sample every epoch); {escape(str(outcome.cache_path))}",
        ),
        (
            "calls",
            f"{calls['calls']}: {calls['completed']} completed, {calls['failed']} failed "
            f"({errors}); "
            f"{base.requeued + cand.requeued} refused by the open breaker were asked again",
        ),
        ("retries", f"{calls['retries']}; failed attempts by reason: {reasons}"),
        (
            "truncations",
            f"{truncations(calls)} streams that ended or stalled mid-answer were caught; "
            f"{calls['tokens_discarded']} partial chunks discarded, none graded or cached",
        ),
        ("breaker", _breaker_path(outcome.breaker)),
        ("concurrency", _limit_line(calls["limit"], calls["overload_retries"])),
        ("tokens", _tokens_line(outcome)),
    ]
    if outcome.injected is not None:
        injected = counts_text(outcome.injected) or "none"
        rows.append(
            (
                "injected",
                f"{sum(outcome.injected.values())} faults ({injected}); the events record "
                f"{sum(calls['attempt_reasons'].values())} failed attempts",
            )
        )
    return rows


def _limit_line(limit: LimitStats, retried: int) -> str:
    """The concurrency limit's path, elided like the breaker's, and the overloads it handled."""
    path = [str(n) for n in limit["path"]]
    if not path:
        return "the limit never moved: no overload"
    shown = " -> ".join(
        path if len(path) <= _PATH_MAX else [*path[: _PATH_MAX - 1], "...", path[-1]]
    )
    return (
        f"limit {shown} ({limit['changes']} changes, min {limit['min']}, max {limit['max']}); "
        f"{retried} attempts cut or refused by overload were retried once a slot was free, "
        "not counted against the breaker"
    )


def _tokens_text(tokens: Tokens) -> str:
    return f"{tokens['total']} ({tokens['prompt']} prompt + {tokens['completion']} completion)"


def _tokens_line(outcome: DemoOutcome) -> str:
    arms = "; ".join(
        f"{r['arm'] or r['run_id']} {_tokens_text(r['tokens'])}" for r in outcome.tokens["runs"]
    )
    total = outcome.tokens["total"]
    return f"{_tokens_text(total)} in {total['calls']} answers from the endpoint; {arms}"


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
