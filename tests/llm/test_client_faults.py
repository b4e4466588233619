"""Every fault of the loopback server, end to end through `chat()` over real sockets."""

from __future__ import annotations

import httpx
import pytest

from trm_llm.errors import FatalLLMError, RetriesExhausted, SseAnomaly
from trm_llm.retry import RetryPolicy
from trm_llm.simulated_server import (
    SimulatedServer,
    cut,
    error_payload,
    malformed,
    normal,
    reset,
    stall,
    status,
    wrong_content_type,
)

from .conftest import USER, ClientFactory, FakeClock, ListSink


async def test_normal_stream(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    result = await make_client().chat(USER, temperature=0)
    assert (result.content, result.finish_reason, result.cached, result.attempts) == (
        "Hello, world",
        "stop",
        False,
        1,
    )
    assert result.ttft_ms is not None and result.max_inter_token_ms is not None
    assert result.usage == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert server.requests[0].body == {
        "model": "sim",
        "messages": USER,
        "temperature": 0,
        "stream": True,
    }
    [event] = sink.of("call_completed")
    assert event["call_id"] == result.call_id and event["cache"] == "off"
    assert event["attempts"][0]["outcome"] == "ok" and event["attempts"][0]["status"] == 200


async def test_truncated_stream_is_retried_not_returned(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink, sleeps: list[float]
) -> None:
    # Plan task 3 end to end: a body that ends cleanly without [DONE] is not an answer.
    server.script(cut(after=2), normal(["full"]))
    result = await make_client().chat(USER)
    assert (result.content, result.attempts) == ("full", 2)
    first = sink.of("call_completed")[0]["attempts"][0]
    assert (first["outcome"], first["reason"], first["tokens_discarded"]) == (
        "retry",
        "truncated_no_done",
        2,
    )
    assert first["sleep_s"] == sleeps[0]


@pytest.mark.parametrize(
    "fault", [cut(after=1, ending="drop"), reset(after=1)], ids=["fin_mid_body", "rst_mid_body"]
)
async def test_disconnects_are_retried(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink, fault: object
) -> None:
    # Plan task 4 end to end: the disconnect family is transient.
    server.script(fault, normal())  # type: ignore[arg-type]
    result = await make_client().chat(USER)
    assert (result.content, result.attempts) == ("Hello, world", 2)
    reason = sink.of("call_completed")[0]["attempts"][0]["reason"]
    assert reason in {"RemoteProtocolError", "ReadError"}


async def test_connection_refused_is_retried_then_exhausted(
    sink: ListSink, sleeps: list[float]
) -> None:
    async def no_sleep(s: float) -> None:
        sleeps.append(s)

    async with SimulatedServer() as gone:
        url = gone.base_url
    from trm_llm.client import GovernedLLMClient

    async with GovernedLLMClient(
        url, "sim", sink=sink, sleep=no_sleep, retry=RetryPolicy(max_attempts=2)
    ) as client:
        with pytest.raises(RetriesExhausted) as info:
            await client.chat(USER)
    assert isinstance(info.value.last_error, httpx.ConnectError)
    assert sink.of("call_failed")[0]["error"] == "retries_exhausted"


async def test_stall_before_first_token(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    server.script(stall(30.0), normal())
    result = await make_client(first_token_timeout_s=0.2).chat(USER)
    assert result.attempts == 2
    assert sink.of("call_completed")[0]["attempts"][0]["reason"] == "stall_first_token"


async def test_stall_between_tokens(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    # The inter-token limit (0.2 s) is far shorter than the first-token one (30 s): a 1 s gap
    # after two tokens must fail the attempt, not wait the gap out and succeed.
    server.script(stall(1.0, after=2), normal())
    client = make_client(first_token_timeout_s=30.0, inter_token_timeout_s=0.2)
    result = await client.chat(USER)
    assert result.attempts == 2
    first = sink.of("call_completed")[0]["attempts"][0]
    assert (first["reason"], first["tokens_discarded"]) == ("stall_inter_token", 2)


@pytest.mark.parametrize("after, reason", [(0, "stall_first_token"), (2, "stall_inter_token")])
@pytest.mark.parametrize("comment", [b": keep-alive\n\n", b": OPENROUTER PROCESSING\n\n"])
async def test_keepalive_comments_do_not_reset_stall_timers(
    server: SimulatedServer,
    make_client: ClientFactory,
    sink: ListSink,
    after: int,
    reason: str,
    comment: bytes,
) -> None:
    # Comments every 50 ms for 1.5 s: if they reset a 0.3 s timer, the first attempt would
    # wait them out and succeed; they must not, so it fails as a stall and is retried.
    server.script(stall(1.5, after=after, keepalive_every_s=0.05, comment=comment), normal())
    client = make_client(first_token_timeout_s=0.3, inter_token_timeout_s=0.3)
    result = await client.chat(USER)
    assert result.attempts == 2
    assert sink.of("call_completed")[0]["attempts"][0]["reason"] == reason


async def test_429_honours_retry_after(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink, sleeps: list[float]
) -> None:
    server.script(status(429, retry_after="7"), normal())
    result = await make_client(retry=RetryPolicy(retry_after_cap_s=60.0)).chat(USER)
    assert result.attempts == 2 and sleeps == [7.0]
    first = sink.of("call_completed")[0]["attempts"][0]
    assert (first["reason"], first["status"], first["sleep_s"]) == ("http_429", 429, 7.0)


async def test_429_retry_after_is_capped(
    server: SimulatedServer, make_client: ClientFactory, sleeps: list[float]
) -> None:
    server.script(status(429, retry_after="3600"), normal())
    await make_client(retry=RetryPolicy(retry_after_cap_s=2.5)).chat(USER)
    assert sleeps == [2.5]


async def test_429_quota_exhausted_is_fatal(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    body = {"error": {"code": "insufficient_quota", "message": "You exceeded your current quota"}}
    server.script(status(429, body), normal())
    with pytest.raises(FatalLLMError) as info:
        await make_client().chat(USER)
    assert info.value.status == 429 and server.request_count == 1
    [failed] = sink.of("call_failed")
    assert (failed["error"], failed["reason"], failed["status"]) == ("fatal", "http_429", 429)


async def test_500_is_retried_until_attempts_run_out(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink, sleeps: list[float]
) -> None:
    server.script(*[status(500)] * 3)
    with pytest.raises(RetriesExhausted) as info:
        await make_client(retry=RetryPolicy(max_attempts=3)).chat(USER)
    assert isinstance(info.value.last_error, httpx.HTTPStatusError)
    assert info.value.attempts == 3 and server.request_count == 3 and len(sleeps) == 2
    [failed] = sink.of("call_failed")
    assert [a["outcome"] for a in failed["attempts"]] == ["retry", "retry", "failed"]
    assert (failed["error"], failed["reason"], failed["status"]) == (
        "retries_exhausted",
        "http_500",
        500,
    )


async def test_total_deadline_stops_retries(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    clock = FakeClock()

    def ticking() -> float:
        clock.now += 4.0  # every look at the clock costs 4 s
        return clock.now

    server.script(*[status(500)] * 10)
    policy = RetryPolicy(max_attempts=10, deadline_s=10.0, base_delay_s=0.0)
    with pytest.raises(RetriesExhausted) as info:
        await make_client(retry=policy, clock=ticking).chat(USER)
    assert info.value.why == "deadline" and server.request_count < 10


@pytest.mark.parametrize("code", [400, 401, 403, 404, 422])
async def test_4xx_is_fatal_and_not_retried(
    server: SimulatedServer, make_client: ClientFactory, code: int
) -> None:
    server.script(status(code), normal())
    with pytest.raises(FatalLLMError) as info:
        await make_client().chat(USER)
    assert info.value.status == code and server.request_count == 1


@pytest.mark.parametrize("kind", ["error", "object", "finish_error", "finish_abort"])
async def test_error_payload_in_200_stream_is_retried(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink, kind: str
) -> None:
    server.script(error_payload(kind), normal())  # type: ignore[arg-type]
    result = await make_client().chat(USER)
    assert (result.content, result.attempts) == ("Hello, world", 2)
    assert sink.of("call_completed")[0]["attempts"][0]["reason"] == "error_payload"


async def test_malformed_json_is_retried(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    server.script(malformed(), normal())
    assert (await make_client().chat(USER)).attempts == 2
    assert sink.of("call_completed")[0]["attempts"][0]["reason"] == "malformed_json"


async def test_all_attempts_truncated_gives_up_with_the_anomaly(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    server.script(*[cut()] * 4)
    with pytest.raises(RetriesExhausted) as info:
        await make_client().chat(USER)
    assert isinstance(info.value.last_error, SseAnomaly)
    assert info.value.last_error.reason == "truncated_no_done"


async def test_wrong_content_type_is_fatal(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    server.script(wrong_content_type(), normal())
    with pytest.raises(FatalLLMError, match="text/event-stream"):
        await make_client().chat(USER)
    assert server.request_count == 1


async def test_unframed_done_is_complete(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    server.script(normal(["a", "b"], done="unframed"))
    result = await make_client().chat(USER)
    assert (result.content, result.attempts) == ("ab", 1)


async def test_usage_only_last_chunk_and_reasoning(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    server.script(normal(["42"], reasoning=["Think. ", "Done."], reasoning_key="reasoning"))
    result = await make_client().chat(USER)
    assert (result.content, result.reasoning) == ("42", "Think. Done.")
    assert result.usage is not None and result.usage["completion_tokens"] == 3


async def test_length_finish_is_returned_flagged(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    server.script(normal(["a"], finish="length"))
    result = await make_client().chat(USER)
    assert (result.finish_reason, result.attempts) == ("length", 1)


async def test_lenient_profile_for_finish_null_dialect(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    dialect = normal(["a"]).steps[:-3]  # role, token; no finish, no usage, no [DONE]
    from trm_llm.simulated_server import Reply

    server.script(Reply(steps=dialect), Reply(steps=dialect))
    result = await make_client(profile="lenient_finish_null").chat(USER)
    assert (result.content, result.finish_reason) == ("a", "stop")
    with pytest.raises(RetriesExhausted):
        await make_client(retry=RetryPolicy(max_attempts=1)).chat(USER)


async def test_reserved_params_and_unknown_profile_are_refused(
    make_client: ClientFactory, server: SimulatedServer
) -> None:
    with pytest.raises(ValueError, match="stream"):
        await make_client().chat(USER, stream=False)
    with pytest.raises(ValueError, match="strict"):
        make_client(profile="loose")
    assert server.request_count == 0
