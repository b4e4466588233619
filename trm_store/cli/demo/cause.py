"""Why a demo gate ended `infra_abort`: the real cause, its counts, and what to try.

INFRA has several causes that call for different remedies, and a report that blames the endpoint
for replies the grader could not read sends a user the wrong way. In order of precedence:

- `unreadable`: most INFRA questions are `parse_error` (the endpoint answered; the grader could
  not read the answers);
- `unreachable`: no call completed at all (nothing listens, or every request failed);
- `overload`: most failed attempts are overload signals (cut streams, 429, 503) and the limiter
  shrank: the endpoint has fewer slots than the calls sent, even at the limit it learnt;
- `breaker`: most failed calls are the breaker's refusals, after the endpoint failed in a row;
- `endpoint`: the calls failed for other reasons (5xx, stalls, error payloads, 4xx).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trm_store.cli.common import counts_text
from trm_store.cli.demo.outcome import ArmSummary
from trm_store.domain.llm_calls import LLMSourceStats

__all__ = ["OVERLOAD_REASONS", "InfraCause", "infra_cause"]

OVERLOAD_REASONS = frozenset(
    {"RemoteProtocolError", "ReadError", "truncated_no_done", "http_429", "http_503"}
)
"""Failed-attempt reasons that too many calls in flight cause (`trm_llm.is_overload_signal`)."""

Kind = Literal["unreadable", "unreachable", "overload", "breaker", "endpoint"]


@dataclass(frozen=True, slots=True)
class InfraCause:
    """The cause (`kind`), one line with its counts, what to try, and the last call error."""

    kind: Kind
    text: str
    hint: str
    counts: dict[str, int]
    last_error: str | None


def infra_cause(calls: LLMSourceStats, baseline: ArmSummary, candidate: ArmSummary) -> InfraCause:
    """The cause of an `infra_abort`, from the calls' figures and both arms' stop reasons."""
    arms = (baseline, candidate)
    asked = sum(a.questions for a in arms)
    unreadable = sum(a.stops.get("parse_error", 0) for a in arms)
    errored = sum(a.stops.get("error", 0) for a in arms)
    last = candidate.last_error or baseline.last_error or calls["last_error"]
    refused = calls["errors"].get("circuit_open", 0) + sum(a.requeued for a in arms)
    failed_attempts = sum(calls["attempt_reasons"].values())
    overloads = sum(n for r, n in calls["attempt_reasons"].items() if r in OVERLOAD_REASONS)
    counts = {
        "questions": asked,
        "unreadable": unreadable,
        "endpoint_errors": errored,
        "calls": calls["calls"],
        "completed": calls["completed"],
        "failed": calls["failed"],
        "refused_by_breaker": refused,
        "overload_retries": calls["overload_retries"],
        "limit_shrank": calls["limit"]["shrank"],
    }
    failed = counts_text(calls["errors"], most_first=True) or "none"

    def cause(kind: Kind, text: str, hint: str) -> InfraCause:
        return InfraCause(kind, text, hint, counts, last)

    if unreadable and unreadable >= errored:
        return cause(
            "unreadable",
            f"{unreadable} of {asked} replies could not be graded (no answer the grader reads), "
            f"while the endpoint completed {calls['completed']} of {calls['calls']} calls",
            "the model does not give its answer in a form the grader reads: a larger model, a "
            "prompt that states the format, or a grader for this model's replies",
        )
    if calls["completed"] == 0:
        return cause(
            "unreachable",
            f"no call completed: {calls['failed']} failed ({failed})",
            "check that a server listens at --base-url and serves /chat/completions for --model",
        )
    if calls["limit"]["shrank"] and overloads * 2 >= max(failed_attempts, 1):
        lowest = calls["limit"]["min"]
        return cause(
            "overload",
            f"the endpoint cut or refused calls for want of capacity: {overloads} of "
            f"{failed_attempts} failed attempts were overload signals, the limit fell to "
            f"{lowest}, and {calls['failed']} calls still failed ({failed})",
            "fewer calls in flight (--concurrency 1), or a server with more slots "
            "(llama.cpp --parallel N, OLLAMA_NUM_PARALLEL)",
        )
    if refused * 2 > calls["failed"] + sum(a.requeued for a in arms):
        return cause(
            "breaker",
            f"the circuit breaker refused {refused} calls after the endpoint failed "
            f"{calls['breaker_opened']} time(s) in a row past its threshold",
            "the endpoint failed repeatedly (see the failed attempts by reason): fix it, then "
            "run again",
        )
    return cause(
        "endpoint",
        f"{errored} questions ended in an endpoint error: {calls['failed']} calls failed "
        f"({failed})",
        "see the failed attempts by reason (trm llm-stats) and fix the endpoint",
    )
