"""The arm helper: ask an arm's questions through any async callable, grade, and turn each into a
`QuestionResult`, so a harness writes no glue between its LLM client and the gate.

Per question: `ask(question)` returns the reply (a string, or an object with `content` and
`finish_reason`, such as trm_llm's `ChatResult`, read by duck typing: this module never imports
trm_llm); the grader reads it. The outcome's stop reason:
- the reply's finish reason when the model itself stopped short (`length`, `content_filter`,
  `tool_calls`): the model's failure, graded as it stands (right only if the grader says so);
- `parse_error` (INFRA) when the grader cannot read the reply;
- `stop` otherwise, with the grader's verdict;
- `error` (INFRA) when `ask` raised one of `infra_errors` (default: any `Exception`): an LLM
  failure is an INFRA result, never a stopped gate or a wrong answer.
An `error` or `parse_error` is INFRA (`correct=None`) when it is in `infra_reasons` (give the
gate's: default {error, parse_error}), else scored as a wrong answer (`correct=False`), as
`trm_store.vocabulary.outcome_problem` says.
A failure that `retry_after(error)` gives a delay for (an open circuit breaker: the call was
refused, not judged) is asked again after that delay, within `max_waits` and `max_wait_s` per
question; the default reads a `retry_after_s` attribute on the exception. Cancellation (and any
exception outside `infra_errors`, e.g. a grader bug) propagates: the gate records the failure.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from trm_gate.errors import GateInputError
from trm_gate.gate import Arm
from trm_gate.grading import Grader
from trm_gate.results import INFRA_STOP_REASONS, QuestionResult, check_infra_reasons

__all__ = [
    "MODEL_STOPS",
    "Answer",
    "AskedQuestion",
    "QuestionAsker",
    "arm_from_callable",
    "retry_after_attribute",
]

MODEL_STOPS = frozenset({"length", "content_filter", "tool_calls"})
"""Finish reasons that are the model's own failure (not INFRA): the reply is graded as it is."""


class AskedQuestion(Protocol):
    """What the helper needs of a question: its id and its unit (the grader may need more)."""

    @property
    def question_id(self) -> str: ...

    @property
    def unit_id(self) -> str: ...


Q = TypeVar("Q", bound=AskedQuestion)


@dataclass(frozen=True, slots=True)
class Answer(Generic[Q]):
    """What one question came to. `reply`: what `ask` returned (None if it failed); `error`:
    the last failure (None if a reply came); `waits`: how often it waited to ask again."""

    question: Q
    result: QuestionResult
    prediction: str | None
    reply: object | None
    error: Exception | None
    waits: int


def retry_after_attribute(error: BaseException) -> float | None:
    """The default `retry_after`: the exception's `retry_after_s` attribute, if it is a number."""
    value = getattr(error, "retry_after_s", None)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return max(0.0, float(value))
    return None


class QuestionAsker(Generic[Q]):
    """`evaluate` is an `Arm.evaluate`: every question of the units asked for, concurrently (limit
    concurrency inside `ask`); `on_answer` sees each `Answer` (e.g. to record a prediction)."""

    def __init__(
        self,
        ask: Callable[[Q], Awaitable[object]],
        grader: Grader[Q],
        questions: Callable[[str], Sequence[Q]],
        *,
        infra_errors: tuple[type[Exception], ...] = (Exception,),
        retry_after: Callable[[Exception], float | None] = retry_after_attribute,
        max_waits: int = 10,
        max_wait_s: float = 60.0,
        on_answer: Callable[[Answer[Q]], None] | None = None,
        infra_reasons: frozenset[str] = INFRA_STOP_REASONS,
    ) -> None:
        self._infra_reasons = check_infra_reasons(infra_reasons)
        for name, fn in (("ask", ask), ("questions", questions), ("retry_after", retry_after)):
            if not callable(fn):
                raise GateInputError(f"{name} must be callable, got {fn!r}")
        if not callable(getattr(grader, "grade", None)):
            raise GateInputError(f"grader must have a grade(question, reply) method: {grader!r}")
        if not isinstance(infra_errors, tuple) or not all(
            isinstance(t, type) and issubclass(t, Exception) for t in infra_errors
        ):
            raise GateInputError("infra_errors must be a tuple of Exception subclasses")
        if isinstance(max_waits, bool) or not isinstance(max_waits, int) or max_waits < 0:
            raise GateInputError(f"max_waits must be an int >= 0, got {max_waits!r}")
        if not isinstance(max_wait_s, int | float) or not 0 <= max_wait_s < math.inf:
            raise GateInputError(f"max_wait_s must be a finite number >= 0, got {max_wait_s!r}")
        self._ask, self._grader, self._questions = ask, grader, questions
        self._infra, self._retry_after = infra_errors, retry_after
        self._max_waits, self._max_wait_s = max_waits, float(max_wait_s)
        self._on_answer = on_answer

    async def evaluate(self, unit_ids: Sequence[str]) -> list[QuestionResult]:
        questions = [q for u in unit_ids for q in self._questions(u)]
        answers = await asyncio.gather(*(self.answer(q) for q in questions))
        return [a.result for a in answers]

    async def answer(self, question: Q) -> Answer[Q]:
        """Ask one question (waiting out refusals), grade it, report it to `on_answer`."""
        reply, error, waits = await self._reply(question)
        answer = self._judge(question, reply, error, waits)
        if self._on_answer is not None:
            self._on_answer(answer)
        return answer

    async def _reply(self, question: Q) -> tuple[object | None, Exception | None, int]:
        deadline = time.monotonic() + self._max_wait_s
        waits = 0
        while True:
            try:
                return await self._ask(question), None, waits
            except self._infra as e:
                delay = self._retry_after(e)
                if delay is None or waits >= self._max_waits or time.monotonic() + delay > deadline:
                    return None, e, waits
            waits += 1
            await asyncio.sleep(delay)

    def _judge(self, q: Q, reply: object | None, error: Exception | None, waits: int) -> Answer[Q]:
        def done(correct: bool | None, stop: str, prediction: str | None = None) -> Answer[Q]:
            if correct is None and stop not in self._infra_reasons:
                correct = False  # not INFRA for this gate: scored as a wrong answer
            result = QuestionResult(q.question_id, q.unit_id, correct, stop)
            return Answer(q, result, prediction, reply, error, waits)

        if reply is None:
            return done(None, "error")
        text = reply if isinstance(reply, str) else getattr(reply, "content", None)
        if not isinstance(text, str):
            raise GateInputError(
                f"ask returned {type(reply).__name__}: a str or an object with `content` is needed"
            )
        finish = "stop" if isinstance(reply, str) else getattr(reply, "finish_reason", None)
        graded = self._grader.grade(q, text)
        if finish in MODEL_STOPS:
            return done(bool(graded.correct), str(finish), graded.prediction)
        if graded.correct is None:
            return done(None, "parse_error")
        return done(graded.correct, "stop", graded.prediction)


def arm_from_callable(
    snapshot: str,
    ask: Callable[[Q], Awaitable[object]],
    grader: Grader[Q],
    *,
    questions: Callable[[str], Sequence[Q]],
    infra_errors: tuple[type[Exception], ...] = (Exception,),
    retry_after: Callable[[Exception], float | None] = retry_after_attribute,
    max_waits: int = 10,
    max_wait_s: float = 60.0,
    on_answer: Callable[[Answer[Q]], None] | None = None,
    infra_reasons: frozenset[str] = INFRA_STOP_REASONS,
) -> Arm:
    """An `Arm` whose questions (`questions(unit_id)`) are asked through `ask` and graded by
    `grader`; put the grader's version in `snapshot`. See the module docstring for the rules."""
    asker = QuestionAsker(
        ask,
        grader,
        questions,
        infra_errors=infra_errors,
        retry_after=retry_after,
        max_waits=max_waits,
        max_wait_s=max_wait_s,
        on_answer=on_answer,
        infra_reasons=infra_reasons,
    )
    return Arm(snapshot, asker.evaluate)
