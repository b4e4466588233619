"""The trm_llm exception tree; third-party errors are translated at the client boundary.

```
LLMError                      base of every error trm_llm raises on purpose
├── SseAnomaly(.reason)       a 200 stream that is not a complete answer (transient: retried)
├── FatalLLMError(.status)    no retry can fix it (400/401/403/404, other 4xx, quota
│                             exhausted, wrong content type, unsupported protocol, a body
│                             that cannot be decoded); not held against the breaker
├── CircuitOpenError          the breaker rejected the call; nothing was sent
├── EventSinkError            the store sink could not commit an event (the store failed or
│                             refused it; the cause is chained): `chat()` raises it rather than
│                             return an answer whose event is not recorded
├── RetriesExhausted          transient failures until attempts or the deadline ran out, or
│       (.last_error, .why)   until they opened the breaker (why: attempts|deadline|circuit_open)
├── CorruptEntryError(.reason) a stored cache entry could not be decoded (caches turn it into a
│                             miss plus a `cache_corrupt` event; it never reaches `chat()`)
└── LLMConfigError            bad input, refused before anything is sent or stored (also a
    │                         ValueError, as these errors always were)
    ├── APIKeyError           the API key is not a valid HTTP header value (CR, LF, NUL,
    │                         leading/trailing space, non-ASCII); the message never holds it
    ├── LLMSettingsError      settings refused at start-up; names variables, never values
    ├── CacheTTLError         a cache TTL that is not a positive int of seconds
    └── CacheKeyError         cache-key input with no canonical JSON form, a reserved param,
                              a key string that is not a digest, a bad namespace
```
Messages carry the reason, status and endpoint; never a request header, so never the API key.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "SSE_ANOMALY_REASONS",
    "APIKeyError",
    "AnomalyReason",
    "CacheKeyError",
    "CacheTTLError",
    "CircuitOpenError",
    "CorruptEntryError",
    "EventSinkError",
    "FatalLLMError",
    "LLMConfigError",
    "LLMError",
    "LLMSettingsError",
    "RetriesExhausted",
    "SseAnomaly",
]

AnomalyReason = Literal[
    "truncated_no_done",
    "error_payload",
    "malformed_json",
    "stall_first_token",
    "stall_inter_token",
    "line_too_long",
]
SSE_ANOMALY_REASONS: frozenset[str] = frozenset(get_args(AnomalyReason))


class LLMError(Exception):
    """Base class: catch this to handle every failure trm_llm reports."""


class SseAnomaly(LLMError):
    """The stream ended or stalled without a complete answer; `reason` says how."""

    def __init__(self, reason: AnomalyReason, detail: str = "") -> None:
        if reason not in SSE_ANOMALY_REASONS:
            raise ValueError(f"unknown SSE anomaly reason {reason!r}")
        self.reason: AnomalyReason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class FatalLLMError(LLMError):
    """A failure no retry can fix; `status` is the HTTP error status, None if it was no status
    (a wrong content type on a 200, an unsupported URL scheme, a proxy error)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class CircuitOpenError(LLMError):
    """The circuit breaker for `source` is open (or a probe is already in flight)."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__(f"circuit open for source {source!r}; call not sent")


class EventSinkError(LLMError):
    """An event could not be committed to the store; `__cause__` is the store's error."""


class RetriesExhausted(LLMError):
    """Every allowed attempt failed transiently; `last_error` is the final failure."""

    def __init__(self, last_error: BaseException, *, attempts: int, why: str) -> None:
        self.last_error = last_error
        self.attempts = attempts
        self.why = why
        super().__init__(f"gave up after {attempts} attempt(s) ({why}); last error: {last_error!r}")


class CorruptEntryError(LLMError):
    """A stored entry could not be decoded; `reason` is bad_json, wrong_shape or wrong_version."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class LLMConfigError(LLMError, ValueError):
    """An argument or setting trm_llm cannot work with; nothing was sent or stored."""


class APIKeyError(LLMConfigError):
    """The API key cannot be sent as a header value; the message describes it, never holds it."""


class LLMSettingsError(LLMConfigError):
    """Settings refused at start-up; the message names each bad variable, never echoes a value."""


class CacheTTLError(LLMConfigError):
    """The cache TTL is not a positive integer number of seconds."""


class CacheKeyError(LLMConfigError):
    """The key inputs (or a key string, or a namespace) are unusable; nothing was read or stored."""
