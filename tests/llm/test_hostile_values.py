"""Issue 15.6: every call is recorded. Hostile usage, finish_reason and status values are
sanitised (clamped, truncated, replaced) on the trm_llm side, and the event says so.

Before the fix each of these calls returned (or failed) normally while the store refused its
event (a log line, nothing recorded). Here the sink is the real store sink on both backends.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trm_llm import FatalLLMError, RetryPolicy, StoreEventSink
from trm_llm.sanitise import INT_MAX, clean_event, clean_usage
from trm_llm.simulated_server import Reply, SimulatedServer, sse
from trm_store import Store, open_store

from .conftest import USER, ClientFactory


def _answer(finish: Any = "stop", usage: Any = None, raw_usage: bytes | None = None) -> Reply:
    """A complete answer whose finish_reason and usage are whatever the test says."""
    head = {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}
    last: dict[str, Any] = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    tail = (
        sse(last)
        if raw_usage is None
        else b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": '
        + raw_usage
        + b"}\n\n"
    )
    if usage is not None:
        tail = sse({**last, "usage": usage})
    return Reply(steps=(sse(head), tail, sse("[DONE]")))


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"prompt_tokens": 1}
    for _ in range(depth):
        value = {"d": value}
    return value


# `says`: a word of the event's note; None where the decoder already repaired the text (a lone
# UTF-16 half is U+FFFD, as invalid UTF-8 is), so nothing is left to sanitise.
COMPLETED_CASES: dict[str, tuple[Reply, str | None]] = {
    "usage NaN": (_answer(raw_usage=b'{"prompt_tokens": NaN, "total_tokens": 3}'), "replaced"),
    "usage 2^63": (_answer(usage={"prompt_tokens": 2**63, "total_tokens": 2**63}), "clamped"),
    "usage -5": (_answer(usage={"completion_tokens": -5}), "clamped"),
    "NUL in usage": (_answer(usage={"model\u0000": "a\u0000b", "prompt_tokens": 1}), "NUL"),
    "usage 400 deep": (_answer(usage=_nested(400)), "dropped"),
    "NUL in finish_reason": (_answer(finish="stop\u0000"), "NUL"),
    "finish_reason of 300": (_answer(finish="x" * 300), "truncated"),
    "lone surrogate finish": (_answer(finish="\ud800"), None),
}


@pytest.mark.postgres
@pytest.mark.parametrize("case", list(COMPLETED_CASES), ids=list(COMPLETED_CASES))
async def test_a_hostile_answer_is_returned_and_its_event_written(
    store: Store, server: SimulatedServer, make_client: ClientFactory, case: str
) -> None:
    reply, says = COMPLETED_CASES[case]
    server.script(reply)
    client = make_client(sink=StoreEventSink(store), retry=RetryPolicy(max_attempts=1))
    answer = await client.chat(USER)
    assert answer.content == "ok"
    events = [e for e in store.read_all() if e.type == "llm.call_completed"]
    assert len(events) == 1, "the call was not recorded"
    data = events[0].data
    assert data["call_id"] == answer.call_id
    if says is None:
        assert not data.get("sanitised")
        assert answer.finish_reason == "\ufffd"
    else:
        assert any(says in note for note in data["sanitised"]), data["sanitised"]
    assert len(data["finish_reason"]) <= 255 and "\x00" not in data["finish_reason"]
    json.dumps(data, allow_nan=False)  # storable JSON: no NaN, no surrogate, no 2^63
    if isinstance(answer.usage, dict):  # what chat() returns is what was stored
        assert answer.usage == data["usage"]


@pytest.mark.postgres
async def test_a_status_of_799_is_a_recorded_fatal_error(
    store: Store, server: SimulatedServer, make_client: ClientFactory
) -> None:
    server.script(Reply(status=799, headers=(("Content-Type", "text/plain"),), steps=(b"odd",)))
    client = make_client(sink=StoreEventSink(store), retry=RetryPolicy(max_attempts=1))
    with pytest.raises(FatalLLMError):
        await client.chat(USER)
    [event] = [e for e in store.read_all() if e.type == "llm.call_failed"]
    assert event.data["status"] is None and event.data["attempts"][0]["status"] is None
    assert event.data["reason"] == "http_799"
    assert any("799" in note for note in event.data["sanitised"])


async def test_a_hostile_parent_id_and_salt_are_still_recorded(
    sqlite_url: str, server: SimulatedServer, make_client: ClientFactory
) -> None:
    with open_store(sqlite_url) as store:
        client = make_client(sink=StoreEventSink(store))
        await client.chat(USER, parent_call_id="p" * 400, cache_salt="s\u0000" * 600)
        [event] = [e for e in store.read_all() if e.type == "llm.call_completed"]
    assert len(event.data["parent_call_id"]) == 255 and len(event.data["cache_salt"]) == 1000
    assert len(event.data["sanitised"]) == 3


def test_a_clean_event_is_left_as_it_is() -> None:
    payload = {"call_id": "c", "finish_reason": "stop", "status": 200, "usage": {"total_tokens": 3}}
    assert clean_event(payload) == payload  # no `sanitised` key when nothing changed
    assert clean_usage({"prompt_tokens": INT_MAX, "details": {"cached": [1, 2.5]}})[1] == []


def test_a_cache_problem_with_an_unstorable_message_is_still_recorded(sqlite_url: str) -> None:
    """A storage error's message is quoted in the cache event: NUL and halves are replaced."""
    from trm_llm.cache import CacheReporter

    key = "a" * 64
    with open_store(sqlite_url) as store:
        reporter = CacheReporter("sqlite", "ns", StoreEventSink(store))
        reporter.read_failed(key, OSError("disk \x00 gone \ud800"))
        reporter.write_failed(key, OSError("x" * 5000))
        details = [e.data["detail"] for e in store.read_all() if e.type.startswith("llm.cache_")]
    assert details == ["disk \ufffd gone \ufffd", "x" * 300]
