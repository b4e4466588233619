"""The labelling job behind `trm diagnose`: one LLM verdict per item, one event per verdict.

Input is checked whole before anything is sent or written (`inputs.load_items`,
`tiers.parse_tiers`, `template.PromptTemplate.check`). Then each item not yet done
(`done_question_ids`) is rendered into a prompt, sent through the governed client and its answer
parsed into a tier (`tiers.parse_tier`), which is recorded (`record_diagnosis`) the moment it is
known: a crash loses at most the calls in flight, and a rerun resumes where the log ends.

Decisions a user should know:
- An answer with no recognisable tier, or naming two, is recorded as `uncertain`, with
  `detail.parse` = `unparseable` / `ambiguous` and the answer's start: the call was complete, so
  it is a model outcome, not an infrastructure one; `--retry-uncertain` is how it is asked again.
- A call that fails (retries exhausted, breaker open, a fatal 4xx) records nothing: an
  infrastructure failure is never a label. The item stays undone for the next run. A fatal error
  about the endpoint (401, 403, 404, quota) or an open breaker stops the job from starting new
  items, as every one would fail the same way; a 400/413/422 may be about one prompt only, so
  only that item fails.
- The cache salt is `trm-diagnose:{run_id}:a{n}`, n = diagnoses already recorded for the item: a
  rerun after a crash reuses an answer that completed but was not recorded, while a retry of an
  uncertain item (n >= 1) samples afresh instead of replaying the cached uncertain answer.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trm_llm import CircuitOpenError, FatalLLMError, LLMError, LLMProvider
from trm_store.cli.diagnose.inputs import Item
from trm_store.cli.diagnose.template import PromptTemplate
from trm_store.cli.diagnose.tiers import parse_tier
from trm_store.domain._common import check_id, check_int
from trm_store.domain.diagnosis import done_question_ids, read_diagnoses, record_diagnosis

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["ANSWER_KEPT", "PER_ITEM_STATUSES", "Summary", "diagnose"]

PER_ITEM_STATUSES = frozenset({400, 413, 422})
"""Fatal statuses that may be about one request (a prompt too long), not the endpoint."""
ANSWER_KEPT = 500
"""Characters of the answer kept in a diagnosis's detail."""


@dataclass
class Summary:
    """What one job did. `failed`: items whose call failed (not recorded; a rerun retries them);
    `not_started`: items left when the job stopped early, and `stopped` says why."""

    run_id: str
    items: int
    skipped_done: int
    tiers: Counter[str] = field(default_factory=Counter)
    unparsed: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    not_started: int = 0
    stopped: str | None = None
    fatal: bool = False

    @property
    def diagnosed(self) -> int:
        """Diagnoses recorded by this job."""
        return sum(self.tiers.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "items": self.items,
            "skipped_done": self.skipped_done,
            "diagnosed": self.diagnosed,
            "tiers": dict(self.tiers),
            "unparsed": dict(self.unparsed),
            "failed": dict(self.failed),
            "not_started": self.not_started,
            "stopped": self.stopped,
        }


def _failed(summary: Summary, error: LLMError) -> None:
    """Count a failed call; stop the job if every other item would fail the same way."""
    kind = type(error).__name__
    if isinstance(error, FatalLLMError) and error.status in PER_ITEM_STATUSES:
        summary.failed[f"{kind} http_{error.status}"] += 1
        return
    summary.failed[kind] += 1
    if isinstance(error, FatalLLMError | CircuitOpenError) and summary.stopped is None:
        summary.stopped = f"{kind}: {error}"
        summary.fatal = isinstance(error, FatalLLMError)


async def diagnose(
    store: Store,
    provider: LLMProvider,
    items: Sequence[Item],
    *,
    run_id: str,
    template: PromptTemplate,
    retry_uncertain: bool = False,
    concurrency: int = 4,
    on_start: Callable[[int], None] | None = None,
    on_item: Callable[[], None] | None = None,
) -> Summary:
    """Diagnose every item of `items` not yet done for `run_id`, `concurrency` calls at a time.

    `on_start` gets the number of items to do; `on_item` is called after each one taken on
    (recorded or failed)."""
    check_id("run_id", run_id)
    check_int("concurrency", concurrency, minimum=1)
    template.check(items)
    done = done_question_ids(store, run_id, retry_uncertain=retry_uncertain)
    recorded = {qid: d["attempts"] for qid, d in read_diagnoses(store, run_id).items()}
    todo = [item for item in items if item.question_id not in done]
    summary = Summary(run_id, len(items), len(items) - len(todo))
    pending = iter(todo)
    if on_start is not None:
        on_start(len(todo))

    async def one(item: Item) -> None:
        salt = f"trm-diagnose:{run_id}:a{recorded.get(item.question_id, 0)}"
        messages = [{"role": "user", "content": template.render(item)}]
        try:
            answer = await provider.chat(messages, cache_salt=salt)
        except LLMError as e:
            _failed(summary, e)
            return
        parsed = parse_tier(answer.content, template.tiers)
        detail = {
            "parse": parsed.how,
            "answer": answer.content[:ANSWER_KEPT],
            "finish_reason": answer.finish_reason,
            "call_id": answer.call_id,
            "cached": answer.cached,
        }
        record_diagnosis(
            store, run_id=run_id, question_id=item.question_id, tier=parsed.tier, detail=detail
        )
        summary.tiers[parsed.tier] += 1
        if parsed.how in ("ambiguous", "unparseable"):
            summary.unparsed[parsed.how] += 1

    async def worker() -> None:
        for item in pending:
            if summary.stopped is not None:
                summary.not_started += 1
                continue
            await one(item)
            if on_item is not None:
                on_item()

    workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, max(1, len(todo))))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return summary
