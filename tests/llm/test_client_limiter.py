"""The governed client's concurrency limiter against a real loopback server with few slots: the
limit settles at or below what the server sustains and every call completes, without the
breaker opening; an outage still opens it; the deadline covers the wait for a slot; a cancelled
call gives its slot back."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Literal

import pytest

from trm_llm import (
    CircuitBreaker,
    ConcurrencyLimiter,
    GovernedLLMClient,
    RetriesExhausted,
    RetryPolicy,
)
from trm_llm.simulated_server import SimulatedServer, cut, normal, stall

from .conftest import USER, ClientFactory, ListSink


async def _burst(client: GovernedLLMClient, limiter: ConcurrencyLimiter, n: int) -> list[int]:
    """`n` calls at once, each completing; the limit seen as each one returned."""
    seen: list[int] = []

    async def one(i: int) -> None:
        result = await client.chat([{"role": "user", "content": f"q{i}"}])
        assert result.finish_reason == "stop"
        seen.append(limiter.limit)

    await asyncio.gather(*(one(i) for i in range(n)))
    return seen


@pytest.mark.parametrize(("k", "mode"), [(1, "cut"), (2, "cut"), (3, "503")])
async def test_the_limit_settles_at_or_below_the_servers_slots_and_every_call_completes(
    server: SimulatedServer,
    make_client: ClientFactory,
    sink: ListSink,
    k: int,
    mode: Literal["cut", "503"],
) -> None:
    server.default = normal(["tok"] * 4, delay_s=0.005)
    server.max_in_flight, server.overload = k, mode
    limiter = ConcurrencyLimiter(8, ceiling=16)
    breaker = CircuitBreaker(fail_threshold=3, cooldown_s=60.0)
    client = make_client(limiter=limiter, breaker=breaker, retry=RetryPolicy(deadline_s=60.0))
    seen = await _burst(client, limiter, 80)
    assert len(seen) == 80  # every call completed
    later = seen[len(seen) // 2 :]
    assert Counter(later).most_common(1)[0][0] <= k, seen  # settled at or below k
    assert max(later) <= k + 1, seen  # at most an occasional probe one above
    assert server.overloaded > 0 and server.overloaded < 40  # learnt, then few cut
    assert not sink.of("breaker_changed")  # overload is not an outage
    moves = sink.of("limit_changed")
    assert moves[0]["from_limit"] == 8 and moves[0]["cause"] == "overload"
    assert all(1 <= m["to_limit"] <= 16 and m["ceiling"] == 16 for m in moves)
    overloads = [a for e in sink.of("call_completed") for a in e["attempts"] if a["overload"]]
    assert len(overloads) >= server.overloaded - 1 and all(
        a["outcome"] == "retry" for a in overloads
    )
    assert limiter.in_flight == 0


async def test_an_endpoint_that_refuses_connections_still_opens_the_breaker(
    sink: ListSink,
) -> None:
    async with SimulatedServer() as gone:
        url = gone.base_url  # a port nothing listens on once it is stopped
    limiter = ConcurrencyLimiter(4, ceiling=8)
    breaker = CircuitBreaker(fail_threshold=3, cooldown_s=60.0)
    async with GovernedLLMClient(
        url, "sim", limiter=limiter, breaker=breaker, sink=sink, retry=RetryPolicy(max_attempts=2)
    ) as client:
        results = await asyncio.gather(
            *(client.chat(USER) for _ in range(6)), return_exceptions=True
        )
    assert all(isinstance(r, Exception) for r in results)
    assert breaker.snapshot("sim", time.time()).state == "open"
    assert not sink.of("limit_changed")  # a refused connection says nothing about load


async def test_an_endpoint_that_fails_every_call_even_at_limit_one_opens_the_breaker(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    server.default = cut(after=2)  # every stream ends before its finish, however few are sent
    limiter = ConcurrencyLimiter(4, ceiling=8)
    breaker = CircuitBreaker(fail_threshold=3, cooldown_s=60.0)
    client = make_client(limiter=limiter, breaker=breaker, retry=RetryPolicy(max_attempts=3))
    results = await asyncio.gather(*(client.chat(USER) for _ in range(8)), return_exceptions=True)
    assert all(isinstance(r, RetriesExhausted) for r in results)
    assert limiter.limit == 1
    assert breaker.snapshot("sim", time.time()).state == "open"
    assert [e["to_state"] for e in sink.of("breaker_changed")] == ["open"]


async def test_the_deadline_covers_the_wait_for_a_slot(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    server.script(stall(3.0, then=normal()))
    limiter = ConcurrencyLimiter(1, ceiling=1)  # shared by both clients: one endpoint
    holder = make_client(limiter=limiter, retry=RetryPolicy(deadline_s=30.0))
    waiter = make_client(limiter=limiter, retry=RetryPolicy(deadline_s=0.3))
    busy = asyncio.create_task(holder.chat(USER))
    while limiter.in_flight == 0:
        await asyncio.sleep(0.01)
    started = time.perf_counter()
    with pytest.raises(RetriesExhausted) as info:
        await waiter.chat(USER)
    assert info.value.why == "deadline" and time.perf_counter() - started < 2.0
    assert server.request_count == 1  # the waiter never sent anything
    failed = sink.of("call_failed")[-1]
    assert failed["attempts"] == [] and "waiting for one of 1 slots" in failed["detail"]
    assert (await busy).content == "Hello, world"
    assert (limiter.in_flight, limiter.waiting) == (0, 0)


async def test_a_cancelled_call_gives_its_slot_back(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    server.script(stall(5.0, then=normal()))
    limiter = ConcurrencyLimiter(1, ceiling=1)
    client = make_client(limiter=limiter)
    first = asyncio.create_task(client.chat(USER))
    while limiter.in_flight == 0:
        await asyncio.sleep(0.01)
    queued = asyncio.create_task(client.chat(USER))  # waits for the slot
    await asyncio.sleep(0.05)
    assert limiter.waiting == 1
    queued.cancel()
    first.cancel()
    await asyncio.gather(first, queued, return_exceptions=True)
    assert (limiter.in_flight, limiter.waiting, limiter.limit) == (0, 0, 1)
    assert (await asyncio.wait_for(client.chat(USER), 60.0)).content == "Hello, world"
