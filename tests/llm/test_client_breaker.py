"""The breaker in front of real requests: one probe on recovery, cancelled probes, fatal 4xx."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from trm_llm.breaker import CircuitBreaker
from trm_llm.errors import CircuitOpenError, FatalLLMError, RetriesExhausted
from trm_llm.retry import RetryPolicy
from trm_llm.simulated_server import SimulatedServer, cut, normal, stall, status

from .conftest import USER, ClientFactory, FakeClock, ListSink


async def test_hundred_callers_at_cooldown_end_send_one_request(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    clock = FakeClock(0.0)
    breaker = CircuitBreaker(fail_threshold=1, cooldown_s=10.0)
    breaker.force_open("sim", 0.0)
    server.default = normal(["ok"], delay_s=0.05)  # the probe is still in flight for the rest
    client = make_client(breaker=breaker, clock=clock)
    clock.now = 10.0
    results = await asyncio.gather(*(client.chat(USER) for _ in range(100)), return_exceptions=True)
    assert server.request_count == 1
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert sum(isinstance(r, CircuitOpenError) for r in results) == 99
    assert breaker.snapshot("sim", 10.0).state == "closed"
    changes = [(e["from_state"], e["to_state"]) for e in sink.of("breaker_changed")]
    assert changes == [("open", "half_open"), ("half_open", "closed")]
    assert len(sink.of("call_failed")) == 99 and len(sink.of("call_completed")) == 1


async def test_consecutive_failures_open_the_breaker(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    breaker = CircuitBreaker(fail_threshold=2, cooldown_s=30.0)
    client = make_client(breaker=breaker, clock=FakeClock(), retry=RetryPolicy(max_attempts=5))
    server.script(status(500), status(500), normal())
    with pytest.raises(RetriesExhausted) as info:
        await client.chat(USER)
    assert info.value.why == "circuit_open" and server.request_count == 2
    with pytest.raises(CircuitOpenError):
        await client.chat(USER)
    assert server.request_count == 2
    assert [e["error"] for e in sink.of("call_failed")] == ["retries_exhausted", "circuit_open"]


async def test_failed_probe_reopens(server: SimulatedServer, make_client: ClientFactory) -> None:
    clock = FakeClock(0.0)
    breaker = CircuitBreaker(fail_threshold=1, cooldown_s=10.0)
    breaker.force_open("sim", 0.0)
    clock.now = 10.0
    server.script(status(503))
    with pytest.raises(RetriesExhausted):
        await make_client(breaker=breaker, clock=clock).chat(USER)
    assert breaker.snapshot("sim", 10.0).state == "open" and server.request_count == 1


async def test_cancelled_probe_does_not_wedge_the_breaker(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    clock = FakeClock(0.0)
    breaker = CircuitBreaker(fail_threshold=1, cooldown_s=10.0, probe_timeout_s=600.0)
    breaker.force_open("sim", 0.0)
    clock.now = 10.0
    server.script(stall(30.0), normal(["after"]))
    client = make_client(breaker=breaker, clock=clock)
    probe = asyncio.create_task(client.chat(USER))
    while server.request_count == 0:
        await asyncio.sleep(0.01)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    # The lease came back at once (not after the 600 s probe timeout): the next call probes.
    result = await client.chat(USER)
    assert result.content == "after" and breaker.snapshot("sim", 10.0).state == "closed"
    assert sink.of("call_failed")[0]["error"] == "cancelled"


async def test_fatal_4xx_counts_neither_way(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    clock = FakeClock(0.0)
    breaker = CircuitBreaker(fail_threshold=1, cooldown_s=10.0)
    client = make_client(breaker=breaker, clock=clock)
    server.script(status(401))
    with pytest.raises(FatalLLMError):
        await client.chat(USER)
    assert breaker.snapshot("sim", 0.0).state == "closed"  # not a failure
    breaker.force_open("sim", 0.0)
    clock.now = 10.0
    server.script(status(401))
    with pytest.raises(FatalLLMError):
        await client.chat(USER)  # the probe: a 401 says nothing about recovery...
    assert breaker.snapshot("sim", 10.0).state == "half_open"  # ...so it is not a success
    assert (await client.chat(USER)).content == "Hello, world"  # and the lease was released


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


async def test_late_failure_of_an_older_call_keeps_the_one_probe(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    # Issue 15 point 8a: a call admitted while closed fails during the probe; it must neither
    # reopen the breaker nor free the probe's lease (no second probe while the first flies).
    clock = FakeClock(0.0)
    breaker = CircuitBreaker(fail_threshold=1, cooldown_s=10.0, probe_timeout_s=600.0)
    client = make_client(breaker=breaker, clock=clock, retry=RetryPolicy(max_attempts=1))
    server.script(stall(0.4, then=cut(after=1)), status(500), normal(["pro", "be"], delay_s=0.5))
    older = asyncio.create_task(client.chat(USER))
    await _until(lambda: server.request_count == 1)
    with pytest.raises(RetriesExhausted):
        await client.chat(USER)  # opens the breaker
    clock.now = 10.0
    probe = asyncio.create_task(client.chat(USER))
    await _until(lambda: server.request_count == 3)
    with pytest.raises(RetriesExhausted):
        await older  # fails late, while the probe is in flight
    clock.now = 20.0  # past any cooldown the late failure could have started
    with pytest.raises(CircuitOpenError):
        await client.chat(USER)
    assert server.request_count == 3
    assert (await probe).content == "probe"
    assert breaker.snapshot("sim", 20.0).state == "closed"
    changes = [(e["from_state"], e["to_state"]) for e in sink.of("breaker_changed")]
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


async def test_late_success_of_an_older_call_does_not_close_an_open_breaker(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    # Issue 15 point 8b: open -> closed only through half-open.
    clock = FakeClock(0.0)
    breaker = CircuitBreaker(fail_threshold=1, cooldown_s=10.0)
    client = make_client(breaker=breaker, clock=clock, retry=RetryPolicy(max_attempts=1))
    server.script(normal(["late"], delay_s=0.2), status(500))
    older = asyncio.create_task(client.chat(USER))
    await _until(lambda: server.request_count == 1)
    with pytest.raises(RetriesExhausted):
        await client.chat(USER)
    assert (await older).content == "late"  # the answer is still the caller's
    assert breaker.snapshot("sim", 1.0).state == "open"
    with pytest.raises(CircuitOpenError):
        await client.chat(USER)
    changes = [(e["from_state"], e["to_state"]) for e in sink.of("breaker_changed")]
    assert changes == [("closed", "open")]
