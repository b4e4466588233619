"""Which failures are worth retrying, and the pure retry decision ("decide, then act").

`RetryPolicy.decide` looks at the attempt number, the error, the time spent and a random draw,
and returns `Sleep(delay_s)` or `GiveUp(why)`; the client does the sleeping, so tests build the
inputs directly and nothing here touches a clock.
"""

from __future__ import annotations

import email.utils
import math
import re
from dataclasses import dataclass
from typing import Literal

import httpx
from httpx_sse import SSEError

from trm_llm.errors import LLMConfigError, SseAnomaly

__all__ = [
    "GiveUp",
    "RetryPolicy",
    "Sleep",
    "is_transient_error",
    "parse_retry_after",
    "retry_after_of",
]

# Transport errors that a second try cannot fix: a bad URL scheme, a request we built wrong,
# a misconfigured proxy, an endpoint that does not speak SSE.
_NEVER_RETRY = (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.ProxyError, SSEError)
_TRANSIENT_STATUSES = frozenset({408, 409, 429})
_QUOTA = re.compile(r"insufficient_quota|quota[ _]?(exceeded|exhausted)|exceeded[^\"]*quota", re.I)


def is_transient_error(exc: BaseException) -> bool:
    """True if retrying the same request may succeed (see the failure table in docs/llm.md)."""
    if isinstance(exc, SseAnomaly):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        if status == 429:
            return not _says_quota_exhausted(exc.response)
        return status in _TRANSIENT_STATUSES or 500 <= status <= 599
    if isinstance(exc, _NEVER_RETRY):
        return False
    return isinstance(exc, httpx.TimeoutException | httpx.TransportError)


def _says_quota_exhausted(response: httpx.Response) -> bool:
    try:
        body = response.text
    except httpx.ResponseNotRead:
        return False
    return bool(_QUOTA.search(body))


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date); None if unusable."""
    if not value or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - now)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


def retry_after_of(exc: BaseException, *, now: float) -> float | None:
    """The Retry-After of an HTTP status error, if it carries a usable one."""
    if isinstance(exc, httpx.HTTPStatusError):
        return parse_retry_after(exc.response.headers.get("retry-after"), now=now)
    return None


@dataclass(frozen=True)
class Sleep:
    """Retry after sleeping `delay_s` seconds."""

    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    """Stop: the error is fatal, or the attempts or the total deadline are used up."""

    why: Literal["fatal", "attempts", "deadline"]


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter, bounded attempts and a total deadline."""

    max_attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    deadline_s: float = 120.0
    retry_after_cap_s: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise LLMConfigError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        for name in ("base_delay_s", "max_delay_s", "retry_after_cap_s"):
            if not getattr(self, name) >= 0:
                raise LLMConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.deadline_s > 0:
            raise LLMConfigError(f"deadline_s must be > 0, got {self.deadline_s!r}")

    def decide(
        self,
        *,
        attempt: int,
        error: BaseException,
        elapsed_s: float,
        rand: float,
        retry_after_s: float | None = None,
    ) -> Sleep | GiveUp:
        """After failed attempt number `attempt` (1-based): sleep and retry, or give up.

        `rand` in [0, 1] is the jitter draw; a server's Retry-After replaces the backoff, capped
        at `retry_after_cap_s`. A sleep that would end past the deadline is not started.
        """
        if not is_transient_error(error):
            return GiveUp("fatal")
        if attempt >= self.max_attempts:
            return GiveUp("attempts")
        if retry_after_s is not None:
            delay = min(retry_after_s, self.retry_after_cap_s)
        else:
            delay = rand * min(self.max_delay_s, self.base_delay_s * 2.0 ** min(attempt - 1, 64))
        if elapsed_s + delay >= self.deadline_s:
            return GiveUp("deadline")
        return Sleep(delay)
