"""The cause an `infra_abort` report names, for each kind of INFRA (issue 17 point 4): the
figures decide it, in the documented order, and each cause carries its counts and a remedy."""

from __future__ import annotations

from typing import Any, cast

import pytest

from trm_store.cli.demo.cause import infra_cause
from trm_store.cli.demo.outcome import ArmSummary
from trm_store.cli.demo.prompts import baseline_prompt
from trm_store.domain.llm_calls import LLMSourceStats


def _arm(stops: dict[str, int], requeued: int = 0, last_error: str | None = None) -> ArmSummary:
    return ArmSummary(
        run_id="r",
        prompt=baseline_prompt(),
        snapshot="s",
        salt="x",
        units=[],
        questions=sum(stops.values()),
        stops=stops,
        requeued=requeued,
        last_error=last_error,
    )


def _calls(**figures: Any) -> LLMSourceStats:
    base: dict[str, Any] = {
        "calls": 40,
        "completed": 30,
        "failed": 10,
        "errors": {"retries_exhausted": 10},
        "attempt_reasons": {"http_500": 30},
        "overload_retries": 0,
        "limit": {"changes": 0, "shrank": 0, "current": None, "min": None, "max": None, "path": []},
        "breaker_opened": 0,
        "last_error": "http_500: HTTP 500 simulated 500",
    }
    return cast(LLMSourceStats, base | figures)


@pytest.mark.parametrize(
    ("calls", "stops", "requeued", "kind", "says"),
    [
        (_calls(failed=0, errors={}), {"parse_error": 20, "stop": 20}, 0, "unreadable", "20 of 40"),
        (_calls(completed=0, failed=40), {"error": 40}, 0, "unreachable", "no call completed"),
        (
            _calls(
                attempt_reasons={"RemoteProtocolError": 25, "http_500": 5},
                overload_retries=25,
                limit={"changes": 3, "shrank": 3, "current": 1, "min": 1, "max": 4, "path": []},
            ),
            {"error": 10, "stop": 30},
            0,
            "overload",
            "the limit fell to 1",
        ),
        (
            _calls(errors={"circuit_open": 30, "retries_exhausted": 5}, failed=35),
            {"error": 35, "stop": 5},
            20,
            "breaker",
            "refused 50 calls",
        ),
        (_calls(), {"error": 10, "stop": 30}, 0, "endpoint", "10 questions ended"),
    ],
)
def test_each_kind_of_infra_is_named(
    calls: LLMSourceStats, stops: dict[str, int], requeued: int, kind: str, says: str
) -> None:
    cause = infra_cause(calls, _arm({}), _arm(stops, requeued))
    assert cause.kind == kind and says in cause.text, cause.text
    assert cause.hint and cause.counts["questions"] == sum(stops.values())
    assert cause.last_error == calls["last_error"]  # from the events when the arms have none


def test_the_arms_last_error_comes_first() -> None:
    cause = infra_cause(_calls(), _arm({"error": 1}, last_error="base"), _arm({}, last_error="c"))
    assert cause.last_error == "c"
