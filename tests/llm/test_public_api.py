"""The public names of trm_llm are exactly these, with the signatures SPEC section 6 fixes."""

from __future__ import annotations

import inspect

import trm_llm
import trm_llm.cache
import trm_llm.settings
from trm_llm import CircuitBreaker, GovernedLLMClient, RetryPolicy
from trm_llm.errors import (
    APIKeyError,
    CacheKeyError,
    CacheTTLError,
    CircuitOpenError,
    CorruptEntryError,
    FatalLLMError,
    LLMConfigError,
    LLMError,
    LLMSettingsError,
    RetriesExhausted,
    SseAnomaly,
)


def test_exported_names_are_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(trm_llm).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert sorted(trm_llm.__all__) == sorted(public)
    assert len(trm_llm.__all__) == len(set(trm_llm.__all__))


def test_error_tree() -> None:
    for cls in (SseAnomaly, FatalLLMError, CircuitOpenError, RetriesExhausted):
        assert issubclass(cls, LLMError)
    # Issue 13: every public exception sits in the tree; the old ValueErrors stay ValueErrors.
    errors = [v for v in vars(trm_llm).values() if isinstance(v, type)]
    errors = [v for v in errors if issubclass(v, BaseException)]
    assert {e.__name__ for e in errors if not issubclass(e, LLMError)} == set()
    for cls in (CacheTTLError, LLMSettingsError, CacheKeyError, APIKeyError, LLMConfigError):
        assert issubclass(cls, LLMError) and issubclass(cls, ValueError)
    assert issubclass(CorruptEntryError, LLMError)
    assert trm_llm.cache.CacheKeyError is CacheKeyError  # the old import paths keep working
    assert trm_llm.settings.CacheTTLError is CacheTTLError
    assert trm_llm.settings.LLMSettingsError is LLMSettingsError
    assert trm_llm.cache.CorruptEntryError is CorruptEntryError
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
