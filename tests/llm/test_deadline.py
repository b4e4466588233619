"""Issue 15.2: `deadline_s` bounds the whole call, whatever the server sends; only events that
carry content or a finish reset the stall timers.

Each server here misbehaves on a real loopback socket. Before the fix, a server dripping
`data: {"choices":[]}` (or one token) every 0.3 s kept `chat()` running far past `deadline_s`,
and empty data events reset the first-token timer. The outer `wait_for` turns such a hang
into a failure instead of a stuck test run.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from trm_llm import RetriesExhausted, RetryPolicy, SseAnomaly
from trm_llm.simulated_server import Reply, SimulatedServer, normal, sse, status
from trm_llm.stored_cache import StoredResponseCache

from .conftest import USER, ClientFactory, ListSink

GUARD_S = 20.0  # far past every bound below: only a hang reaches it
EMPTY = sse({"object": "chat.completion.chunk", "choices": []})
ROLE = sse({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
TOKEN = sse({"choices": [{"index": 0, "delta": {"content": "t"}, "finish_reason": None}]})


def drip(event: bytes, *, every_s: float = 0.3, for_s: float = 60.0) -> Reply:
    """`event` every `every_s` seconds for `for_s` seconds, then the body ends unfinished."""
    steps: list[bytes | float] = []
    for _ in range(int(for_s / every_s)):
        steps += [event, every_s]
    return Reply(steps=tuple(steps))


async def _timed_failure(client_call: object) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(RetriesExhausted) as info:
        await asyncio.wait_for(client_call, GUARD_S)  # type: ignore[arg-type]
    return info.value, time.monotonic() - started


@pytest.mark.parametrize("event", [EMPTY, ROLE, TOKEN], ids=["empty", "role_only", "one_token"])
async def test_a_dripping_server_cannot_hold_a_call_past_its_deadline(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink, event: bytes
) -> None:
    server.default = drip(event)
    client = make_client(
        retry=RetryPolicy(max_attempts=4, deadline_s=3.0),
        first_token_timeout_s=60.0,
        inter_token_timeout_s=30.0,
        sleep=asyncio.sleep,
    )
    error, elapsed = await _timed_failure(client.chat(USER))
    assert isinstance(error, RetriesExhausted) and error.why == "deadline"
    assert 3.0 <= elapsed < 3.0 + 2.0
    [failed] = sink.of("call_failed")
    assert (failed["error"], failed["reason"]) == ("retries_exhausted", "deadline")
    assert failed["attempts"][-1]["reason"] == "deadline"
    assert "3.0s" in failed["detail"]
    assert sink.of("call_completed") == []


@pytest.mark.parametrize("event", [EMPTY, ROLE], ids=["empty", "role_only"])
async def test_events_without_content_do_not_reset_the_first_token_timer(
    server: SimulatedServer, make_client: ClientFactory, event: bytes
) -> None:
    server.default = drip(event)
    client = make_client(
        retry=RetryPolicy(max_attempts=1, deadline_s=60.0),
        first_token_timeout_s=1.0,
        inter_token_timeout_s=1.0,
    )
    error, elapsed = await _timed_failure(client.chat(USER))
    assert isinstance(error, RetriesExhausted) and error.why == "attempts"
    assert isinstance(error.last_error, SseAnomaly)
    assert error.last_error.reason == "stall_first_token"
    assert elapsed < 1.0 + 2.0


async def test_empty_events_between_tokens_do_not_reset_the_inter_token_timer(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    server.default = Reply(steps=(TOKEN, *drip(EMPTY).steps))
    client = make_client(
        retry=RetryPolicy(max_attempts=1, deadline_s=60.0),
        first_token_timeout_s=5.0,
        inter_token_timeout_s=1.0,
    )
    error, elapsed = await _timed_failure(client.chat(USER))
    assert isinstance(error, RetriesExhausted)
    assert isinstance(error.last_error, SseAnomaly)
    assert error.last_error.reason == "stall_inter_token"
    assert elapsed < 1.0 + 2.0


async def test_the_deadline_covers_the_backoff_sleeps(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    """A backoff that would sleep past the deadline is cut by the asyncio timeout."""

    async def slow_sleep(_seconds: float) -> None:
        await asyncio.sleep(30.0)

    server.default = status(503)
    client = make_client(retry=RetryPolicy(max_attempts=4, deadline_s=1.0), sleep=slow_sleep)
    error, elapsed = await _timed_failure(client.chat(USER))
    assert isinstance(error, RetriesExhausted) and error.why == "deadline"
    assert elapsed < 1.0 + 2.0
    [failed] = sink.of("call_failed")
    assert failed["reason"] == "deadline"
    assert [a["outcome"] for a in failed["attempts"]] == ["retry"]
    assert [a["reason"] for a in failed["attempts"]] == ["http_503"]


async def test_a_slow_but_steady_answer_within_the_deadline_completes(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    server.default = normal(["a", "b", "c"], delay_s=0.3)
    client = make_client(retry=RetryPolicy(deadline_s=5.0), inter_token_timeout_s=1.0)
    answer = await asyncio.wait_for(client.chat(USER), GUARD_S)
    assert (answer.content, answer.finish_reason) == ("abc", "stop")


async def test_a_complete_answer_whose_cache_write_outlives_the_deadline_is_returned(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    """The deadline cuts the cache write, not the answer already complete."""
    from trm_llm.cache import CachedResponse, ResponseCache

    class SlowWrites(ResponseCache):
        async def get(self, key: str) -> CachedResponse | None:
            return None

        async def set(self, key: str, value: CachedResponse) -> bool:
            await asyncio.sleep(30.0)
            return True

    server.default = normal(["done"])
    client = make_client(cache=SlowWrites(), retry=RetryPolicy(deadline_s=1.0))
    answer = await asyncio.wait_for(client.chat(USER), GUARD_S)
    assert (answer.content, answer.cached) == ("done", False)
    [completed] = sink.of("call_completed")
    assert completed["cache_write"] == "failed"
    assert sink.of("call_failed") == []


def slow_reads(read_s: float, op_timeout_s: float | None) -> StoredResponseCache:
    """A `StoredResponseCache` whose every read takes `read_s` (its writes are instant)."""

    class SlowReads(StoredResponseCache):
        backend = "slow"
        storage_errors = (OSError,)

        async def _read(self, key: str) -> str | bytes | None:
            await asyncio.sleep(read_s)
            return None

        async def _write(self, key: str, payload: str) -> None:
            return None

    return SlowReads(ttl_s=60, namespace="slow", sink=None, op_timeout_s=op_timeout_s)


@pytest.mark.parametrize("op_timeout_s", [None, 5.0], ids=["unbounded", "bound_past_deadline"])
async def test_the_deadline_cuts_a_cache_read_the_cache_does_not_bound_within_it(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink, op_timeout_s: float | None
) -> None:
    client = make_client(cache=slow_reads(30.0, op_timeout_s), retry=RetryPolicy(deadline_s=1.0))
    error, elapsed = await _timed_failure(client.chat(USER))
    assert error.why == "deadline" and elapsed < 1.0 + 1.0  # type: ignore[attr-defined]
    assert [e["reason"] for e in sink.of("call_failed")] == ["deadline"]


async def test_a_cache_read_bounded_within_the_deadline_leaves_the_call_the_rest_of_it(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    """The read (its own timeout: 0.5 s of the 1.5 s) runs before the call's timeout is armed;
    a miss then leaves the call what is left of the deadline, not a fresh one."""
    server.default = drip(TOKEN)
    client = make_client(cache=slow_reads(30.0, 0.5), retry=RetryPolicy(deadline_s=1.5))
    error, elapsed = await _timed_failure(client.chat(USER))
    assert error.why == "deadline"  # type: ignore[attr-defined]
    assert 1.5 - 0.1 < elapsed < 1.5 + 0.35  # a fresh 1.5 s after the read: 2.0 s
    [failed] = sink.of("call_failed")
    assert failed["reason"] == "deadline" and failed["cache"] == "miss"
