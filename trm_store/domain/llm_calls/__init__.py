"""LLM calls (seed tasks 1-5): the governed client's events on `llm:{source}` and their read models.

`trm_llm.StoreEventSink` appends what `GovernedLLMClient` and the response caches emit. The
package has one module per job:

- `models`: the strict event models and type names (a drifting payload is refused unwritten);
- `projection`: the `llm_calls` projection (calls, breaker transitions, limit changes, cache
  problems);
- `queries`: the rows, in log order (`llm_calls`, `llm_call`, `breaker_transitions`,
  `cache_problems`);
- `stats`: the one aggregation per source (`llm_stats`), shown by `trm llm-stats` and the demo;
- `tokens`: token totals per source and salt (inside `llm_stats`), per run, arm and gate
  (`token_totals`).
"""

from __future__ import annotations

from trm_store.domain.llm_calls.models import (
    BREAKER_CHANGED,
    CACHE_CORRUPT,
    CACHE_READ_FAILED,
    CACHE_WRITE_FAILED,
    CALL_COMPLETED,
    CALL_FAILED,
    LIMIT_CHANGED,
    llm_stream,
)
from trm_store.domain.llm_calls.projection import LLMCallsProjection
from trm_store.domain.llm_calls.queries import (
    breaker_transitions,
    cache_problems,
    limit_changes,
    llm_call,
    llm_calls,
)
from trm_store.domain.llm_calls.stats import (
    LimitStats,
    LLMSourceStats,
    SaltCalls,
    Spread,
    llm_sources,
    llm_stats,
    percentile,
)
from trm_store.domain.llm_calls.tokens import (
    RunTokens,
    Tokens,
    TokenTotals,
    no_tokens,
    token_totals,
)

__all__ = [
    "BREAKER_CHANGED",
    "CACHE_CORRUPT",
    "CACHE_READ_FAILED",
    "CACHE_WRITE_FAILED",
    "CALL_COMPLETED",
    "CALL_FAILED",
    "LIMIT_CHANGED",
    "LLMCallsProjection",
    "LLMSourceStats",
    "LimitStats",
    "RunTokens",
    "SaltCalls",
    "Spread",
    "TokenTotals",
    "Tokens",
    "breaker_transitions",
    "cache_problems",
    "limit_changes",
    "llm_call",
    "llm_calls",
    "llm_sources",
    "llm_stats",
    "llm_stream",
    "no_tokens",
    "percentile",
    "token_totals",
]
