"""The public names of trm_llm are exactly these, with the signatures SPEC section 6 fixes."""

from __future__ import annotations

import inspect

import trm_llm
from trm_llm import CircuitBreaker, GovernedLLMClient, RetryPolicy
from trm_llm.errors import CircuitOpenError, FatalLLMError, LLMError, RetriesExhausted, SseAnomaly


def test_exported_names() -> None:
    assert set(trm_llm.__all__) == {
        "CacheKeyError",
        "CacheTTLError",
        "CachedResponse",
        "ChatResult",
        "CircuitBreaker",
        "CircuitOpenError",
        "EventSink",
        "FatalLLMError",
        "GovernedLLMClient",
        "LLMError",
        "LLMProvider",
        "LLMSettings",
        "LLMSettingsError",
        "RedisResponseCache",
        "ResponseCache",
        "RetriesExhausted",
        "RetryPolicy",
        "SqliteResponseCache",
        "SseAnomaly",
        "StoreEventSink",
        "VisionLLMClient",
        "build_cache_key",
        "is_transient_error",
        "resolve_cache_ttl",
    }
    assert all(hasattr(trm_llm, name) for name in trm_llm.__all__)


def test_error_tree() -> None:
    for cls in (SseAnomaly, FatalLLMError, CircuitOpenError, RetriesExhausted):
        assert issubclass(cls, LLMError)
    assert SseAnomaly("stall_first_token").reason == "stall_first_token"
    assert FatalLLMError("x", status=401).status == 401
    err = ValueError("inner")
    assert RetriesExhausted(err, attempts=2, why="attempts").last_error is err


def test_spec_signatures() -> None:
    client = inspect.signature(GovernedLLMClient)
    assert list(client.parameters)[:10] == [
        "base_url",
        "model",
        "api_key",
        "cache",
        "breaker",
        "retry",
        "sink",
        "http",
        "profile",
        "source",
    ]
    assert client.parameters["profile"].default == "strict"
    chat = inspect.signature(GovernedLLMClient.chat)
    assert list(chat.parameters) == ["self", "messages", "parent_call_id", "cache_salt", "params"]
    breaker = inspect.signature(CircuitBreaker).parameters
    assert [breaker[n].default for n in ("fail_threshold", "cooldown_s", "probe_timeout_s")] == [
        5,
        30.0,
        60.0,
    ]
    assert RetryPolicy() == RetryPolicy(
        max_attempts=4, base_delay_s=0.5, max_delay_s=20.0, deadline_s=120.0, retry_after_cap_s=60.0
    )
    result_fields = list(inspect.signature(trm_llm.ChatResult).parameters)
    assert result_fields == [
        "content",
        "reasoning",
        "finish_reason",
        "usage",
        "cached",
        "attempts",
        "call_id",
        "ttft_ms",
        "max_inter_token_ms",
    ]
