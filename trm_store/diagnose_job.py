"""The labelling job behind `trm diagnose`: one LLM verdict per item, one event per verdict.

Input is checked whole before anything is sent or written (`load_items`, `parse_tiers`,
`PromptTemplate.check`). Then each item not yet done (`done_question_ids`) is rendered into a
prompt, sent through the governed client and its answer parsed into a tier, which is recorded
(`record_diagnosis`) the moment it is known: a crash loses at most the calls in flight, and a
rerun resumes where the log ends.

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
import json
import re
import string
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trm_llm import CircuitOpenError, EventSink, FatalLLMError, LLMError, LLMProvider
from trm_store.domain._common import check_id, check_int
from trm_store.domain.diagnosis import (
    UNCERTAIN,
    done_question_ids,
    read_diagnoses,
    record_diagnosis,
)
from trm_store.domain.errors import DomainInputError

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = [
    "DEFAULT_TEMPLATE",
    "DEFAULT_TIERS",
    "DiagnoseInputError",
    "Item",
    "Parsed",
    "PromptTemplate",
    "Summary",
    "TallyingSink",
    "diagnose",
    "load_items",
    "parse_tier",
    "parse_tiers",
]

DEFAULT_TIERS = ("correct", "wrong", UNCERTAIN)
DEFAULT_TEMPLATE = """\
Judge whether the model's answer in the item below is right.

$fields

Reply with exactly one word, one of: $tiers.
Say "uncertain" if the item does not let you tell.
"""
PER_ITEM_STATUSES = frozenset({400, 413, 422})
"""Fatal statuses that may be about one request (a prompt too long), not the endpoint."""
ANSWER_KEPT = 500
"""Characters of the answer kept in a diagnosis's detail."""

_WORD = re.compile(r"[a-z0-9]+(?:[-_][a-z0-9]+)*")
"""A word of an answer, and the shape of a tier: `_` and `-` only inside (`_wrong_` is emphasis)."""
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_RESERVED_PLACEHOLDERS = frozenset({"question_id", "fields", "tiers"})


class DiagnoseInputError(DomainInputError):
    """The items file, the template or the tier list cannot be used; nothing was sent or written."""


@dataclass(frozen=True, slots=True)
class Item:
    """One line of the items file: its question id and every other field."""

    question_id: str
    fields: dict[str, Any]


# -- input ----------------------------------------------------------------------------------------


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def load_items(path: Path) -> list[Item]:
    """Every item of a JSONL file; DiagnoseInputError naming the line for a bad or duplicate one."""
    items: list[Item] = []
    first_seen: dict[str, int] = {}
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    item = _item(line, f"{path}:{number}")
                    if item.question_id in first_seen:
                        raise DiagnoseInputError(
                            f"{path}:{number}: duplicate question_id {item.question_id!r} "
                            f"(first on line {first_seen[item.question_id]})"
                        )
                    first_seen[item.question_id] = number
                    items.append(item)
    except FileNotFoundError as e:
        raise DiagnoseInputError(f"items file {str(path)!r} does not exist") from e
    except (OSError, UnicodeDecodeError) as e:
        raise DiagnoseInputError(f"cannot read items file {str(path)!r}: {e}") from e
    if not items:
        raise DiagnoseInputError(f"items file {str(path)!r} holds no items")
    return items


def _item(line: str, where: str) -> Item:
    try:
        value = json.loads(line, parse_constant=_refuse_constant)
    except ValueError as e:
        raise DiagnoseInputError(f"{where}: not valid JSON ({e})") from e
    if not isinstance(value, dict) or "question_id" not in value:
        raise DiagnoseInputError(f"{where}: an item must be a JSON object with a question_id")
    fields = dict(value)
    question_id = fields.pop("question_id")
    try:
        check_id("question_id", question_id)
    except DomainInputError as e:
        raise DiagnoseInputError(f"{where}: {e}") from e
    return Item(question_id, fields)


def parse_tiers(text: str) -> tuple[str, ...]:
    """A comma-separated tier list: two or more distinct lower-case words, `uncertain` included."""
    tiers = tuple(t.strip() for t in text.split(","))
    bad = [t for t in tiers if not _WORD.fullmatch(t) or len(t) > 64]
    if bad:
        raise DiagnoseInputError(
            f"tiers must be lower-case words of a-z, 0-9 and inner _ or - (at most 64 "
            f"characters), got {bad}"
        )
    if len(set(tiers)) != len(tiers) or len(tiers) < 2 or UNCERTAIN not in tiers:
        raise DiagnoseInputError(
            f"tiers must be at least two distinct names including {UNCERTAIN!r}, got {list(tiers)}"
        )
    return tiers


class PromptTemplate:
    """A `string.Template`: `$question_id`, `$fields` (every other field, one `name: value` line
    each), `$tiers` (the allowed answers), and `$name` for any item field."""

    def __init__(self, text: str, tiers: Sequence[str]) -> None:
        self._template = string.Template(text)
        if not text.strip() or not self._template.is_valid():
            raise DiagnoseInputError(
                "the template must be non-empty and use $name / ${name} placeholders "
                "(write $$ for a literal $)"
            )
        self.tiers = tuple(tiers)
        self.fields = frozenset(self._template.get_identifiers()) - _RESERVED_PLACEHOLDERS

    @classmethod
    def load(cls, path: Path | None, tiers: Sequence[str]) -> PromptTemplate:
        """The template in `path`, or the default one."""
        if path is None:
            return cls(DEFAULT_TEMPLATE, tiers)
        try:
            return cls(path.read_text(encoding="utf-8"), tiers)
        except (OSError, UnicodeDecodeError) as e:
            raise DiagnoseInputError(f"cannot read template {str(path)!r}: {e}") from e

    def check(self, items: Iterable[Item]) -> None:
        """Every item has every field the template names (checked before anything is sent)."""
        for item in items:
            missing = sorted(self.fields - item.fields.keys())
            if missing:
                raise DiagnoseInputError(
                    f"item {item.question_id!r} lacks field(s) {missing} used by the template"
                )

    def render(self, item: Item) -> str:
        """The prompt for one item."""
        values = {name: _text(value) for name, value in item.fields.items()}
        lines = "\n".join(f"{name}: {text}" for name, text in values.items())
        return self._template.substitute(
            values, question_id=item.question_id, fields=lines, tiers=", ".join(self.tiers)
        )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# -- parsing the answer ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Parsed:
    """The tier read from an answer and how: `first_word`, `only_tier`, `ambiguous` (several
    tiers named) or `unparseable` (none); the last two give `uncertain`."""

    tier: str
    how: str


def parse_tier(answer: str, tiers: Sequence[str]) -> Parsed:
    """The answer's tier: its first word if that is a tier, else the one tier it names."""
    words = _WORD.findall(_THINK.sub(" ", answer).lower())
    if words and words[0] in tiers:
        return Parsed(words[0], "first_word")
    named = {w for w in words if w in tiers}
    if len(named) == 1:
        return Parsed(named.pop(), "only_tier")
    return Parsed(UNCERTAIN, "ambiguous" if named else "unparseable")


# -- the job ---------------------------------------------------------------------------------------


class TallyingSink:
    """Forwards the client's events and counts this job's calls, cache hits, retries (requests
    sent after a call's first) and failed attempts by reason, as `trm llm-stats` counts them."""

    def __init__(self, inner: EventSink | None) -> None:
        self._inner = inner
        self.calls = 0
        self.cache_hits = 0
        self.retries = 0
        self.failed_attempts: Counter[str] = Counter()

    def emit(self, source: str, event_type: str, data: Mapping[str, Any]) -> Awaitable[None] | None:
        if event_type in ("call_completed", "call_failed"):
            attempts = data.get("attempts", ())
            self.calls += 1
            self.cache_hits += data.get("cache") == "hit"
            self.retries += max(len(attempts) - 1, 0)
            self.failed_attempts.update(
                str(a.get("reason")) for a in attempts if a.get("outcome") != "ok"
            )
        if self._inner is not None:  # its commit receipt, for the client to await
            return self._inner.emit(source, event_type, data)
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "cache_hits": self.cache_hits,
            "retries": self.retries,
            "failed_attempts_by_reason": dict(self.failed_attempts),
        }


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
