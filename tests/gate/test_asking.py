"""The arm helper (issue 17 point 5): any async callable becomes an arm; a failed call is an INFRA
`error` result, not a stopped gate; a refused call waits and is asked again; cancellation and
errors outside `infra_errors` propagate."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from trm_gate import (
    Answer,
    Gate,
    GateInputError,
    QuestionAsker,
    ShortAnswerGrader,
    arm_from_callable,
    retry_after_attribute,
)
from trm_store import Store


@dataclass(frozen=True)
class Q:
    question_id: str
    unit_id: str
    text: str
    answer: str


@dataclass(frozen=True)
class Reply:
    content: str
    finish_reason: str | None


class Refused(Exception):
    retry_after_s = 0.01


QUESTIONS = {
    f"u{u}": [Q(f"u{u}-q{i}", f"u{u}", f"What is {u} + {i}?", str(u + i)) for i in range(2)]
    for u in range(30)
}


def questions(unit_id: str) -> list[Q]:
    return QUESTIONS[unit_id]


async def test_replies_become_results() -> None:
    replies = {
        "u1-q0": "ANSWER: 1",  # right
        "u1-q1": Reply("three", "stop"),  # wrong (2 expected)
        "u2-q0": Reply("I would rather not say", "stop"),  # unreadable: parse_error
        "u2-q1": Reply("Let me think: 2 + 1 = 3 and", "length"),  # the model's own stop
    }
    seen: list[Answer[Q]] = []

    async def ask(q: Q) -> object:
        return replies[q.question_id]

    asker = QuestionAsker(ask, ShortAnswerGrader(), questions, on_answer=seen.append)
    results = {r.question_id: r for r in await asker.evaluate(["u1", "u2"])}
    assert {q: (r.correct, r.stop_reason) for q, r in results.items()} == {
        "u1-q0": (True, "stop"),
        "u1-q1": (False, "stop"),
        "u2-q0": (None, "parse_error"),
        "u2-q1": (True, "length"),  # graded as it stands: its last number is right
    }
    assert sorted(a.question.question_id for a in seen) == sorted(replies)
    assert {a.question.question_id: a.prediction for a in seen}["u1-q1"] == "3"


async def test_a_failed_call_is_an_infra_result_and_the_gate_goes_on(store: Store) -> None:
    async def good(q: Q) -> str:
        return f"ANSWER: {q.answer}"

    async def flaky(q: Q) -> str:
        if q.unit_id in ("u3", "u7"):
            raise ConnectionError("connection reset by peer")
        return f"ANSWER: {q.answer}"

    grader = ShortAnswerGrader()
    baseline = arm_from_callable("base|" + grader.version, good, grader, questions=questions)
    candidate = arm_from_callable("cand|" + grader.version, flaky, grader, questions=questions)
    result = await Gate(store, block_size=10).run(
        "g-flaky", list(QUESTIONS), baseline=baseline, candidate=candidate, seed=3
    )
    assert result.infra_units_candidate == 2 and result.infra_units_baseline == 0
    assert result.units_evaluated == 30
    assert (result.wins, result.losses, result.ties) == (0, 0, 28)


async def test_a_refused_call_waits_and_is_asked_again() -> None:
    calls: dict[str, int] = {}

    async def ask(q: Q) -> str:
        calls[q.question_id] = calls.get(q.question_id, 0) + 1
        if calls[q.question_id] <= 2:
            raise Refused("circuit open")
        return q.answer

    seen: list[Answer[Q]] = []
    asker = QuestionAsker(ask, ShortAnswerGrader(), questions, on_answer=seen.append)
    results = await asker.evaluate(["u5"])
    assert [r.stop_reason for r in results] == ["stop", "stop"]
    assert all(r.correct for r in results)
    assert [a.waits for a in seen] == [2, 2]
    # Past max_waits the refusal is the outcome: an INFRA error, carrying the last error.
    calls.clear()
    seen.clear()
    bounded = QuestionAsker(ask, ShortAnswerGrader(), questions, max_waits=1, on_answer=seen.append)
    assert [r.stop_reason for r in await bounded.evaluate(["u6"])] == ["error", "error"]
    assert all(isinstance(a.error, Refused) and a.waits == 1 for a in seen)


async def test_cancellation_and_other_errors_propagate() -> None:
    started = asyncio.Event()

    async def hangs(q: Q) -> str:
        started.set()
        await asyncio.sleep(3600)
        return ""

    task = asyncio.create_task(
        QuestionAsker(hangs, ShortAnswerGrader(), questions).evaluate(["u1"])
    )
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def bug(q: Q) -> str:
        raise KeyError("a harness bug, not an LLM failure")

    asker = QuestionAsker(bug, ShortAnswerGrader(), questions, infra_errors=(ConnectionError,))
    with pytest.raises(KeyError):
        await asker.evaluate(["u1"])


def test_retry_after_attribute() -> None:
    assert retry_after_attribute(Refused()) == 0.01
    assert retry_after_attribute(ValueError()) is None
    err = ValueError()
    err.retry_after_s = float("nan")  # type: ignore[attr-defined]
    assert retry_after_attribute(err) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"infra_errors": (BaseException,)},
        {"infra_errors": [Exception]},
        {"max_waits": -1},
        {"max_wait_s": float("inf")},
        {"retry_after": 3},
    ],
)
def test_bad_arguments(kwargs: dict[str, object]) -> None:
    async def ask(q: Q) -> str:
        return ""

    with pytest.raises(GateInputError):
        QuestionAsker(ask, ShortAnswerGrader(), questions, **kwargs)  # type: ignore[arg-type]
