"""The public names of trm_llm are exactly these, with the signatures SPEC section 6 fixes."""

from __future__ import annotations

import inspect

import trm_llm
import trm_llm.cache
import trm_llm.settings
from trm_llm import CircuitBreaker, GovernedLLMClient, RetryPolicy, errors


def test_exported_names_are_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(trm_llm).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert sorted(trm_llm.__all__) == sorted(public)
    assert len(trm_llm.__all__) == len(set(trm_llm.__all__))


def test_error_tree() -> None:
    LLMError = errors.LLMError
    for cls in (errors.SseAnomaly, errors.FatalLLMError, errors.CircuitOpenError):
        assert issubclass(cls, LLMError)
    assert issubclass(errors.RetriesExhausted, LLMError)
    # Issue 13: every public exception sits in the tree; the old ValueErrors stay ValueErrors.
    classes = [v for v in vars(trm_llm).values() if isinstance(v, type)]
    raised = [v for v in classes if issubclass(v, BaseException)]
    assert {e.__name__ for e in raised if not issubclass(e, LLMError)} == set()
    for name in ("CacheTTLError", "LLMSettingsError", "CacheKeyError", "APIKeyError"):
        cls = getattr(errors, name)
        assert issubclass(cls, errors.LLMConfigError) and issubclass(cls, ValueError)
    assert issubclass(errors.LLMConfigError, LLMError)
    assert issubclass(errors.CorruptEntryError, LLMError)
    # The old import paths keep working.
    assert trm_llm.cache.CacheKeyError is errors.CacheKeyError
    assert trm_llm.settings.CacheTTLError is errors.CacheTTLError
    assert trm_llm.settings.LLMSettingsError is errors.LLMSettingsError
    assert trm_llm.cache.CorruptEntryError is errors.CorruptEntryError
    assert errors.SseAnomaly("stall_first_token").reason == "stall_first_token"
    assert errors.FatalLLMError("x", status=401).status == 401
    err = ValueError("inner")
    assert errors.RetriesExhausted(err, attempts=2, why="attempts").last_error is err


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


def test_client_from_settings_and_the_limiter_are_public() -> None:
    """Issue 17: a harness builds its client from `LLMSettings` with no glue of its own."""
    assert {"client_from_settings", "ConcurrencyLimiter", "is_overload_signal"} <= set(
        trm_llm.__all__
    )
    params = inspect.signature(trm_llm.client_from_settings).parameters
    assert list(params)[:2] == ["settings", "sink"]
    assert params["sink"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["sink"].default is None
    assert "limiter" in inspect.signature(GovernedLLMClient).parameters
