"""`trm llm-stats`: per source figures from real calls made by the governed client (a truncated
stream, a 500, a cache hit, a `length` finish, a breaker that opens), read-only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.helpers import trm
from trm_llm import CircuitBreaker, GovernedLLMClient, LLMError, RetryPolicy, SqliteResponseCache
from trm_llm.simulated_server import SimulatedServer, cut, normal, status
from trm_llm.sink import StoreEventSink
from trm_store import cli as launch
from trm_store import open_store
from trm_store.domain.llm_calls import llm_calls, percentile


async def _no_sleep(seconds: float) -> None:
    return None


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def _make_calls(url: str, tmp_path: Path) -> None:
    """Source `a`: ok, truncated then ok, 500 then ok, a cache hit, a `length` finish.
    Source `b`: two 500s open its breaker (the call fails), then a call the breaker rejects."""
    with open_store(url) as store:
        sink = StoreEventSink(store)
        async with SimulatedServer() as server:
            common: dict[str, Any] = {
                "sink": sink,
                "sleep": _no_sleep,
                "retry": RetryPolicy(max_attempts=3),
            }
            cache = SqliteResponseCache(tmp_path / "cache.db", ttl_s=3600)
            async with GovernedLLMClient(
                server.base_url, "sim", source="a", cache=cache, **common
            ) as a:
                server.script(normal(), cut(after=2), normal(), status(500), normal())
                for prompt in ("one", "two", "three", "one"):
                    await a.chat(_ask(prompt))
                server.script(normal(finish="length"))
                await a.chat(_ask("four"), max_tokens=3)
            breaker = CircuitBreaker(fail_threshold=2, cooldown_s=3600)
            async with GovernedLLMClient(
                server.base_url, "sim", source="b", breaker=breaker, **common
            ) as b:
                server.script(status(500), status(500))
                for prompt in ("five", "six"):
                    with pytest.raises(LLMError):
                        await b.chat(_ask(prompt))


async def test_stats_per_source(store_url: str, tmp_path: Path) -> None:
    await _make_calls(store_url, tmp_path)
    with open_store(store_url) as store:
        head = store.head_position()
        fetched = [
            r
            for r in llm_calls(store, source="a")
            if r["outcome"] == "completed" and not r["cache_hit"]
        ]
    latencies = sorted(r["latency_ms"] for r in fetched)
    ttfts = sorted(r["ttft_ms"] for r in fetched)

    result = trm("llm-stats", "--db", store_url, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)["sources"]
    a, b = stats["a"], stats["b"]
    assert {k: a[k] for k in ("calls", "completed", "failed", "cache_hits", "cache_hit_rate")} == {
        "calls": 5,
        "completed": 5,
        "failed": 0,
        "cache_hits": 1,
        "cache_hit_rate": 0.2,
    }
    assert (a["retries"], a["failed_attempts_by_reason"]) == (
        2,
        {"truncated_no_done": 1, "http_500": 1},
    )
    assert (a["truncated_streams"], a["length_finishes"], a["breaker_opened"]) == (1, 1, 0)
    # Nearest rank over the 4 answers fetched from the server (the hit is not one): 2nd and 4th.
    assert a["latency_ms"] == {"n": 4, "p50": latencies[1], "p95": latencies[3]}
    assert a["ttft_ms"] == {"n": 4, "p50": ttfts[1], "p95": ttfts[3]}
    assert (b["calls"], b["failed"], b["breaker_opened"]) == (2, 2, 1)
    assert b["failures_by_error"] == {"retries_exhausted": 1, "circuit_open": 1}
    assert b["latency_ms"] == {"n": 0, "p50": None, "p95": None}

    only_b = trm("llm-stats", "--db", store_url, "--json", "--source", "b", cwd=tmp_path)
    assert json.loads(only_b.stdout)["sources"] == {"b": b}
    unknown = trm("llm-stats", "--db", store_url, "--source", "c", cwd=tmp_path)
    assert unknown.returncode == 2
    assert unknown.stderr.count("\n") == 1
    assert "no LLM calls recorded for source 'c' (known: a, b)" in unknown.stderr
    with open_store(store_url) as store:
        assert store.head_position() == head


async def test_table(sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    open_store(sqlite_url).close()
    assert launch.main(["llm-stats", "--db", sqlite_url]) == 0
    assert "no LLM calls recorded in" in capsys.readouterr().out
    await _make_calls(sqlite_url, tmp_path)
    assert launch.main(["llm-stats", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    rows = {
        cells[1].strip(): [c.strip() for c in cells[2:10]]
        for cells in (line.split("│") for line in out.splitlines() if line.startswith("│ "))
    }
    # calls, ok, failed, cache hit, retries, truncated, length, breaker opens
    assert rows == {
        "a": ["5", "5", "0", "20%", "2", "1", "1", "0"],
        "b": ["2", "0", "2", "0%", "1", "0", "0", "1"],
    }
    assert "a: failed attempts by reason: http_500 1, truncated_no_done 1" in out
    assert "b: failed calls by error: circuit_open 1, retries_exhausted 1" in out


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert (percentile([7.0], 50), percentile([7.0], 95)) == (7.0, 7.0)
    values = [float(v) for v in range(100, 0, -1)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 100)) == (
        50.0,
        95.0,
        100.0,
    )
    with pytest.raises(ValueError):
        percentile(values, 0)
