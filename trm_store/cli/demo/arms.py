"""One arm of the demo's gate: `trm_gate.QuestionAsker` asking through the governed client.

The asker does the arm's work (every question of the units asked for, graded by the demo's
grader; an `LLMError` ends the question as INFRA `error`, an unreadable reply as INFRA
`parse_error`); this module gives it the call and the breaker. The breaker rejects and never
queues, so waiting for it is the harness's job: a question waits while the breaker is open (or
its one probe is out) before it calls, and a call the breaker refused anyway (it raced the
breaker opening) is asked again once the breaker would admit it (`BreakerWait.retry_after`),
a bounded number of times. Every question's outcome is a prediction in the arm's run (`RunLog`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trm_gate import INFRA_STOP_REASONS, Answer, QuestionAsker, QuestionResult
from trm_llm import (
    ChatResult,
    CircuitBreaker,
    CircuitOpenError,
    GovernedLLMClient,
    LLMError,
    RetriesExhausted,
)
from trm_store.cli.demo.pool import Pool, Question
from trm_store.cli.demo.prompts import GRADER, messages
from trm_store.domain.run_log import RunLog

__all__ = ["BreakerWait", "DemoArm", "Requeue"]


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

    def retry_after(self, error: Exception) -> float | None:
        """The asker's `retry_after`: a refused call is asked again after a poll (the call
        itself waits out the rest, `until_admitted`); any other failure is final."""
        return self.requeue.poll_s if refused(error) else None


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
    infra_reasons: frozenset[str] = INFRA_STOP_REASONS  # the gate's: what the asker scores
    asked: int = 0
    requeued: int = 0
    last_error: str | None = None  # the last failure that was not the breaker's refusal
    units: list[str] = field(default_factory=list)
    stops: Counter[str] = field(default_factory=Counter)  # stop_reason -> questions

    def __post_init__(self) -> None:
        self._asker = QuestionAsker[Question](
            self._call,
            GRADER,
            self.pool.unit,
            infra_errors=(LLMError,),
            retry_after=self.wait.retry_after,
            max_waits=self.wait.requeue.max_times,
            max_wait_s=self.wait.requeue.max_wait_s,
            on_answer=self._record,
            infra_reasons=self.infra_reasons,
        )

    async def evaluate(self, unit_ids: Sequence[str]) -> list[QuestionResult]:
        self.units.extend(unit_ids)
        return await self._asker.evaluate(unit_ids)

    async def _call(self, q: Question) -> ChatResult:
        """One governed call, sent once the breaker would admit it (or the wait is over)."""
        await self.wait.until_admitted(time.monotonic() + self.wait.requeue.max_wait_s)
        async with self.limiter:
            return await self.client.chat(
                messages(self.system, q.text), cache_salt=self.salt, **self.params
            )

    def _record(self, answer: Answer[Question]) -> None:
        q, result, reply = answer.question, answer.result, answer.reply
        self.asked += 1
        self.requeued += answer.waits
        fields: dict[str, Any] = {}
        if answer.error is not None:
            fields["error"] = f"{type(answer.error).__name__}: {answer.error}"
            if not refused(answer.error):
                self.last_error = fields["error"]
        if isinstance(reply, ChatResult):
            fields.update(call_id=reply.call_id, cached=reply.cached, attempts=reply.attempts)
            if result.stop_reason == "parse_error":
                fields["reply"] = reply.content[:200]
        self.stops[result.stop_reason] += 1
        self.on_answer()
        self.log.record_prediction(
            q.question_id,
            unit_id=q.unit_id,
            prediction=answer.prediction,
            # The log keeps the question's own outcome (an unreadable reply has no verdict);
            # a gate that scores it as wrong says so in its own config.
            correct=None if result.stop_reason in INFRA_STOP_REASONS else result.correct,
            stop_reason=result.stop_reason,
            expected=q.answer,
            **fields,
        )


def refused(error: Exception) -> bool:
    """True if the breaker refused the call (no answer was judged bad: worth asking again)."""
    if isinstance(error, CircuitOpenError):
        return True
    return isinstance(error, RetriesExhausted) and error.why == "circuit_open"
