"""What the governed client did during one demo run, read back from its events' read models.

The report is built from the `llm_calls` projection (rows after the position the run started
at), not from counters kept on the side: what it shows is what the event log holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trm_store.domain.llm_calls import breaker_transitions, llm_calls
from trm_store.store import Store

__all__ = ["ArmCalls", "CallStats", "collect"]


@dataclass
class ArmCalls:
    """One arm's calls (told apart by their cache salt)."""

    calls: int = 0
    cache_hits: int = 0
    failed: int = 0


@dataclass
class CallStats:
    """Every call of `source` recorded after a position: outcomes, retries, breaker changes."""

    calls: int = 0
    completed: int = 0
    failed: int = 0
    cache_hits: int = 0
    retries: int = 0
    tokens_discarded: int = 0
    failed_attempts: Counter[str] = field(default_factory=Counter)  # reason -> attempts
    errors: Counter[str] = field(default_factory=Counter)  # call_failed kind -> calls
    by_salt: dict[str | None, ArmCalls] = field(default_factory=dict)
    breaker: list[dict[str, Any]] = field(default_factory=list)

    def arm(self, salt: str) -> ArmCalls:
        return self.by_salt.get(salt, ArmCalls())


def collect(store: Store, *, source: str, after: int) -> CallStats:
    """The stats of `source`'s calls whose events sit after position `after`."""
    stats = CallStats()
    for row in llm_calls(store, source=source):
        if row["position"] <= after:
            continue
        stats.calls += 1
        arm = stats.by_salt.setdefault(row["cache_salt"], ArmCalls())
        arm.calls += 1
        if row["outcome"] == "completed":
            stats.completed += 1
        else:
            stats.failed += 1
            arm.failed += 1
            stats.errors[row["error"]] += 1
        if row["cache_hit"]:
            stats.cache_hits += 1
            arm.cache_hits += 1
        stats.retries += max(row["attempts"] - 1, 0)
        stats.tokens_discarded += row["tokens_discarded"]
        stats.failed_attempts.update(row["attempt_reasons"])
    stats.breaker = [t for t in breaker_transitions(store, source=source) if t["position"] > after]
    return stats
