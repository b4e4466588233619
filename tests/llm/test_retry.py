"""Transient/fatal classification, Retry-After parsing and the pure retry decision."""

from __future__ import annotations

import email.utils

import httpx
import pytest
from httpx_sse import SSEError

from trm_llm.errors import CircuitOpenError, FatalLLMError, SseAnomaly
from trm_llm.retry import GiveUp, RetryPolicy, Sleep, is_transient_error, parse_retry_after

REQUEST = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")


def status_error(status: int, body: str = "", headers: dict[str, str] | None = None) -> Exception:
    response = httpx.Response(status, text=body, headers=headers, request=REQUEST)
    return httpx.HTTPStatusError(f"status {status}", request=REQUEST, response=response)


def test_transient_covers_disconnect_family() -> None:
    # Plan task 4: the whole disconnect family is transient, not only ConnectError/ReadTimeout.
    for exc in (
        httpx.RemoteProtocolError("peer reset"),
        httpx.ReadError("read"),
        httpx.WriteError("write"),
        httpx.ConnectError("refused"),
        httpx.ConnectTimeout("ct"),
        httpx.ReadTimeout("rt"),
        httpx.PoolTimeout("pt"),
        httpx.CloseError("close"),
    ):
        assert is_transient_error(exc), exc


@pytest.mark.parametrize(
    "exc",
    [
        httpx.UnsupportedProtocol("ftp"),
        httpx.LocalProtocolError("bad request line"),
        httpx.ProxyError("proxy"),
        SSEError("Expected response header Content-Type to contain 'text/event-stream'"),
    ],
)
def test_errors_no_retry_can_fix_are_fatal(exc: Exception) -> None:
    assert not is_transient_error(exc)


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 599])
def test_transient_statuses(status: int) -> None:
    assert is_transient_error(status_error(status))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 413, 422])
def test_fatal_statuses(status: int) -> None:
    assert not is_transient_error(status_error(status))


@pytest.mark.parametrize(
    "body",
    [
        '{"error": {"code": "insufficient_quota", "message": "You exceeded your current quota"}}',
        '{"error": {"type": "insufficient_quota"}}',
        '{"error": {"message": "Quota exceeded for this billing period"}}',
    ],
)
def test_429_quota_exhausted_is_fatal(body: str) -> None:
    assert not is_transient_error(status_error(429, body))


def test_429_rate_limit_is_transient() -> None:
    assert is_transient_error(status_error(429, '{"error": {"code": "rate_limit_exceeded"}}'))


def test_anomalies_are_transient_and_own_errors_are_not() -> None:
    assert is_transient_error(SseAnomaly("truncated_no_done"))
    assert not is_transient_error(FatalLLMError("x", status=401))
    assert not is_transient_error(CircuitOpenError("p"))
    assert not is_transient_error(ValueError("bug"))


def test_parse_retry_after_seconds_and_date() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("7", now=now) == 7.0
    assert parse_retry_after(" 1.5 ", now=now) == 1.5
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == 30.0
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after(past, now=now) == 0.0
    for bad in (None, "", "soon", "-3", "nan", "inf"):
        assert parse_retry_after(bad, now=now) is None


POLICY = RetryPolicy(
    max_attempts=4, base_delay_s=0.5, max_delay_s=3.0, deadline_s=10.0, retry_after_cap_s=5.0
)
TRANSIENT = httpx.ReadError("reset")


def test_full_jitter_capped_exponential_backoff() -> None:
    delays = [POLICY.decide(attempt=n, error=TRANSIENT, elapsed_s=0.0, rand=1.0) for n in (1, 2, 3)]
    assert delays == [Sleep(0.5), Sleep(1.0), Sleep(2.0)]
    assert POLICY.decide(attempt=3, error=TRANSIENT, elapsed_s=0.0, rand=0.25) == Sleep(0.5)
    big = RetryPolicy(max_attempts=20, base_delay_s=0.5, max_delay_s=3.0)
    assert big.decide(attempt=10, error=TRANSIENT, elapsed_s=0.0, rand=1.0) == Sleep(3.0)


def test_attempts_are_bounded() -> None:
    assert POLICY.decide(attempt=4, error=TRANSIENT, elapsed_s=0.0, rand=0.5) == GiveUp("attempts")


def test_total_deadline_is_bounded() -> None:
    assert POLICY.decide(attempt=1, error=TRANSIENT, elapsed_s=9.8, rand=1.0) == GiveUp("deadline")
    assert POLICY.decide(attempt=1, error=TRANSIENT, elapsed_s=10.0, rand=0.0) == GiveUp("deadline")


def test_fatal_errors_give_up_at_once() -> None:
    assert POLICY.decide(attempt=1, error=status_error(401), elapsed_s=0.0, rand=0.5) == GiveUp(
        "fatal"
    )


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    err = status_error(429)
    assert POLICY.decide(attempt=1, error=err, elapsed_s=0.0, rand=0.1, retry_after_s=4.0) == Sleep(
        4.0
    )
    assert POLICY.decide(
        attempt=1, error=err, elapsed_s=0.0, rand=0.1, retry_after_s=50.0
    ) == Sleep(5.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base_delay_s": -1.0},
        {"max_delay_s": -0.1},
        {"deadline_s": 0.0},
        {"retry_after_cap_s": -1.0},
        {"max_attempts": True},
    ],
)
def test_bad_policy_values_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
