"""One arm of the demo's gate: ask every question of the units asked for, grade, record.

Each question is one governed call (bounded concurrency shared by both arms). The breaker
rejects and never queues, so waiting for it is the harness's job: a question waits while the
breaker is open (or its one probe is out) before it calls, and a call refused anyway (it raced
the breaker opening) is asked again, a bounded number of times. Any other `LLMError` (retries
exhausted, a fatal 4xx) ends the question as INFRA `error`; a reply the grader cannot read ends
it as INFRA `parse_error`. Every question's outcome is a prediction in the arm's run (`RunLog`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trm_gate import QuestionResult
from trm_llm import (
    ChatResult,
    CircuitBreaker,
    CircuitOpenError,
    GovernedLLMClient,
    LLMError,
    RetriesExhausted,
)
from trm_store.cli.demo.pool import Pool, Question
from trm_store.cli.demo.prompts import grade, messages
from trm_store.domain.run_log import RunLog

__all__ = ["BreakerWait", "DemoArm", "Requeue"]

_MODEL_STOPS = frozenset({"length", "content_filter", "tool_calls"})


@dataclass(frozen=True, slots=True)
class Requeue:
    """How often a refused question is asked again, and the longest wait for the breaker."""

    max_times: int
    max_wait_s: float
    poll_s: float = 0.1


@dataclass(frozen=True, slots=True)
class BreakerWait:
    """Tells whether `breaker` would turn a call for `source` away, and waits until it would not."""

    breaker: CircuitBreaker
    source: str
    requeue: Requeue

    def blocked(self) -> bool:
        """Open and cooling down, or half-open with its one probe out."""
        now = time.time()  # the breaker runs on the client's clock: wall time
        state = self.breaker.snapshot(self.source, now)
        if state.state == "open":
            return now < state.open_until
        return state.state == "half_open" and state.lease is not None

    async def until_admitted(self, deadline: float) -> None:
        """Sleep while blocked, until `deadline` (time.monotonic) at the latest."""
        while self.blocked() and time.monotonic() < deadline:
            await asyncio.sleep(self.requeue.poll_s)


@dataclass
class DemoArm:
    """`evaluate` is the gate's `Arm.evaluate` for one prompt; counters feed the report."""

    client: GovernedLLMClient
    pool: Pool
    system: str
    salt: str
    log: RunLog
    limiter: asyncio.Semaphore
    wait: BreakerWait
    params: dict[str, Any]
    on_answer: Callable[[], None] = lambda: None
    asked: int = 0
    requeued: int = 0
    last_error: str | None = None  # the last failure that was not the breaker's refusal
    units: list[str] = field(default_factory=list)
    stops: Counter[str] = field(default_factory=Counter)  # stop_reason -> questions

    async def evaluate(self, unit_ids: Sequence[str]) -> list[QuestionResult]:
        self.units.extend(unit_ids)
        questions = [q for u in unit_ids for q in self.pool.unit(u)]
        return list(await asyncio.gather(*(self._ask(q) for q in questions)))

    async def _ask(self, q: Question) -> QuestionResult:
        self.asked += 1
        result: ChatResult | None = None
        error: str | None = None
        deadline = time.monotonic() + self.wait.requeue.max_wait_s
        for attempt in range(self.wait.requeue.max_times + 1):
            try:
                result = await self._call(q, deadline)
                break
            except LLMError as e:
                error = f"{type(e).__name__}: {e}"
                if not _refused(e):
                    self.last_error = error
                    break
                if attempt == self.wait.requeue.max_times:
                    break
                self.requeued += 1
        self.on_answer()
        if result is None:
            return self._record(q, None, None, "error", error=error)
        graded = grade(result.content, q.answer)
        fields = {"call_id": result.call_id, "cached": result.cached, "attempts": result.attempts}
        if result.finish_reason in _MODEL_STOPS:  # the model's own failure unless still right
            stop = result.finish_reason
            return self._record(q, graded.prediction, bool(graded.correct), stop, **fields)
        if graded.correct is None:
            return self._record(q, None, None, "parse_error", reply=result.content[:200], **fields)
        return self._record(q, graded.prediction, graded.correct, "stop", **fields)

    async def _call(self, q: Question, deadline: float) -> ChatResult:
        """One governed call, sent once the breaker would admit it (or the wait is over)."""
        while True:
            await self.wait.until_admitted(deadline)
            async with self.limiter:
                if self.wait.blocked() and time.monotonic() < deadline:
                    continue  # it opened while this question stood in line: wait outside it
                return await self.client.chat(
                    messages(self.system, q.text), cache_salt=self.salt, **self.params
                )

    def _record(
        self,
        q: Question,
        prediction: str | None,
        correct: bool | None,
        stop_reason: str,
        **fields: Any,
    ) -> QuestionResult:
        self.stops[stop_reason] += 1
        self.log.record_prediction(
            q.question_id,
            unit_id=q.unit_id,
            prediction=prediction,
            correct=correct,
            stop_reason=stop_reason,
            expected=q.answer,
            **fields,
        )
        return QuestionResult(q.question_id, q.unit_id, correct, stop_reason)


def _refused(error: LLMError) -> bool:
    """True if the breaker refused the call (no answer was judged bad: worth asking again)."""
    if isinstance(error, CircuitOpenError):
        return True
    return isinstance(error, RetriesExhausted) and error.why == "circuit_open"
