"""Per-source running totals of the LLM calls, kept by the `llm_calls` projection beside its rows.

`llm_stats` over a whole store must not read every call (a million-event store holds ~166,000):
the projection keeps, per (source, cache salt), what the calls add up to (`llm_call_totals`), and
per source the failed calls by error kind, the failed attempts by reason and the fetched calls
per latency and TTFT bucket (`llm_call_counts`), so the figures are a few rows per source and a
percentile's index walk is one bucket long. `call_counts` says what one call adds: the projection
adds it when a call is recorded, and `llm_stats` sums it over the calls after a position, so both
count the same way. A call recorded again (its `call_id` seen before: its row is replaced) first
takes back what its old row added. Every total is an integer, so a rebuild reproduces them
exactly.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    MetaData,
    String,
    Table,
    Text,
    delete,
)

from trm_store.domain._common import upsert

__all__ = [
    "BOUNDS",
    "COUNTERS",
    "ERROR",
    "LATENCY",
    "REASON",
    "TTFT",
    "bucket",
    "call_counts",
    "call_names",
    "define_totals",
    "key_name",
    "name_key",
    "salt_key",
    "update_totals",
]

COUNTERS = (
    "calls",
    "completed",
    "failed",
    "cache_hits",
    "attempts",
    "retries",
    "tokens_discarded",
    "overload_retries",
    "length_finishes",
    "fetched",  # completed and not a cache hit: the calls whose latency counts
    "timed",  # fetched with a time to first token
    "token_calls",  # fetched with a usage the server reported
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
)
"""The integer figures of `llm_call_totals`, each a sum of `call_counts` over the calls."""

ERROR = "error"
"""`llm_call_counts.kind` of a failed call's error kind."""
REASON = "attempt_reason"
"""`llm_call_counts.kind` of a failed attempt's reason."""


LATENCY = "latency"
"""`llm_call_counts.kind` of the fetched calls per latency bucket (`name`: the bucket)."""
TTFT = "ttft"
"""`llm_call_counts.kind` of the fetched calls per time-to-first-token bucket."""

BOUNDS = tuple(0.01 * 1.1**i for i in range(220))
"""The bucket bounds (ms, 0.01 to ~1.3e7, 10% apart): a time `v` is in bucket
`bisect_right(BOUNDS, v)`, so bucket b holds BOUNDS[b-1] <= v < BOUNDS[b] and a percentile's
index walk starts at its bucket's bound (`llm_stats`), not at the fastest call."""


def bucket(ms: float) -> int:
    """The bucket of a time in ms (see `BOUNDS`)."""
    return bisect.bisect_right(BOUNDS, ms)


def bucket_name(ms: float) -> str:
    """A bucket as `llm_call_counts.name`: zero-padded, so names sort as buckets do."""
    return f"{bucket(ms):03d}"


def salt_key(salt: str | None) -> str:
    """A primary-key part for a cache salt: "" for none, else its SHA-256 (a salt may be 1,000
    characters, too long for a portable index key)."""
    return "" if salt is None else hashlib.sha256(salt.encode()).hexdigest()


def name_key(name: str | None) -> str:
    """A primary-key part for an error kind or attempt reason, which may be None: "" for None,
    else "=" and the name."""
    return "" if name is None else f"={name}"


def key_name(key: str) -> str | None:
    """The name `name_key` made `key` from."""
    return None if key == "" else key[1:]


def call_counts(row: Mapping[Any, Any]) -> dict[str, int]:
    """What one `llm_calls` row adds to each of `COUNTERS` (a cache hit sent no request and
    spent no tokens; a failed call has no latency worth counting)."""
    failed = row["outcome"] == "failed"
    hit = bool(row["cache_hit"])
    fetched = not failed and not hit
    prompt, completion, total = row["prompt_tokens"], row["completion_tokens"], row["total_tokens"]
    usage = fetched and not (prompt is None and completion is None and total is None)
    return {
        "calls": 1,
        "completed": not failed,
        "failed": failed,
        "cache_hits": hit,
        "attempts": row["attempts"],
        "retries": max(row["attempts"] - 1, 0),
        "tokens_discarded": row["tokens_discarded"],
        "overload_retries": row["overload_retries"],
        "length_finishes": row["finish_reason"] == "length",
        "fetched": fetched,
        "timed": fetched and row["ttft_ms"] is not None,
        "token_calls": usage,
        "prompt_tokens": (prompt or 0) if usage else 0,
        "completion_tokens": (completion or 0) if usage else 0,
        "total_tokens": (
            (total if total is not None else (prompt or 0) + (completion or 0)) if usage else 0
        ),
    }


def call_names(row: Mapping[Any, Any]) -> Counter[tuple[str, str | None]]:
    """What one row adds to `llm_call_counts`: its error kind if it failed, the reason of each
    failed attempt, and the buckets of its latency and time to first token if it was fetched
    (completed, not a cache hit), as (kind, name)."""
    names: Counter[tuple[str, str | None]] = Counter((REASON, r) for r in row["attempt_reasons"])
    if row["outcome"] == "failed":
        names[ERROR, row["error"]] += 1
    elif not row["cache_hit"]:
        names[LATENCY, bucket_name(row["latency_ms"])] += 1
        if row["ttft_ms"] is not None:
            names[TTFT, bucket_name(row["ttft_ms"])] += 1
    return names


def define_totals(metadata: MetaData, suffix: str) -> dict[str, Table]:
    """`llm_call_totals` and `llm_call_counts` (the projection defines them with its tables)."""
    totals = Table(
        f"llm_call_totals{suffix}",
        metadata,
        Column("source", String(255), primary_key=True),
        Column("salt_key", String(64), primary_key=True),
        Column("cache_salt", Text, nullable=True),
        *(Column(name, BigInteger, nullable=False) for name in COUNTERS),
    )
    counts = Table(
        f"llm_call_counts{suffix}",
        metadata,
        Column("source", String(255), primary_key=True),
        Column("kind", String(16), primary_key=True),
        Column("name_key", String(256), primary_key=True),
        Column("n", BigInteger, nullable=False),
    )
    return {"totals": totals, "counts": counts}


def update_totals(
    conn: Connection,
    tables: Mapping[str, Table],
    old: Sequence[Mapping[str, Any]],
    new: Sequence[Mapping[str, Any]],
) -> None:
    """Take back what the `old` rows added (calls recorded again) and add the `new` rows."""
    sums: dict[tuple[str, str], Counter[str]] = {}
    salts: dict[tuple[str, str], str | None] = {}
    names: Counter[tuple[str, str, str]] = Counter()
    for sign, rows in ((-1, old), (1, new)):
        for row in rows:
            key = (row["source"], salt_key(row["cache_salt"]))
            salts[key] = row["cache_salt"]
            total = sums.setdefault(key, Counter())
            for counter, value in call_counts(row).items():
                total[counter] += sign * value
            for (kind, name), n in call_names(row).items():
                names[row["source"], kind, name_key(name)] += sign * n
    totals, counts = tables["totals"], tables["counts"]
    total_rows = [
        {"source": source, "salt_key": salt, "cache_salt": salts[source, salt]}
        | {name: delta[name] for name in COUNTERS}
        for (source, salt), delta in sums.items()
    ]
    upsert(conn, totals, total_rows, keys=_TOTALS_KEY, update=COUNTERS, add=True)
    count_rows = [
        {"source": source, "kind": kind, "name_key": name, "n": n}
        for (source, kind, name), n in names.items()
        if n
    ]
    upsert(conn, counts, count_rows, keys=_COUNTS_KEY, update=("n",), add=True)
    if old:  # a replaced call may leave a total at zero: gone, as a rebuild would not make it
        conn.execute(delete(totals).where(totals.c.calls == 0))
        conn.execute(delete(counts).where(counts.c.n == 0))


_TOTALS_KEY = ("source", "salt_key")
_COUNTS_KEY = ("source", "kind", "name_key")
