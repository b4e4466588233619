"""trm_llm: a governed LLM client (SSE completeness, retries, circuit breaker, adaptive
concurrency, response cache); `client_from_settings` builds one from `LLMSettings`."""

from trm_llm.breaker import CircuitBreaker
from trm_llm.cache import CachedResponse, ResponseCache, build_cache_key
from trm_llm.client import ChatResult, GovernedLLMClient
from trm_llm.errors import (
    APIKeyError,
    CacheKeyError,
    CacheTTLError,
    CircuitOpenError,
    CorruptEntryError,
    EventSinkError,
    FatalLLMError,
    LLMConfigError,
    LLMError,
    LLMSettingsError,
    RetriesExhausted,
    SseAnomaly,
)
from trm_llm.from_settings import client_from_settings
from trm_llm.limiter import ConcurrencyLimiter, is_overload_signal
from trm_llm.protocols import EventSink, LLMProvider
from trm_llm.redis_cache import RedisResponseCache
from trm_llm.retry import RetryPolicy, is_transient_error
from trm_llm.settings import LLMSettings, resolve_cache_ttl
from trm_llm.sink import StoreEventSink
from trm_llm.sqlite_cache import SqliteResponseCache
from trm_llm.vision import VisionLLMClient

__all__ = [
    "APIKeyError",
    "CacheKeyError",
    "CacheTTLError",
    "CachedResponse",
    "ChatResult",
    "CircuitBreaker",
    "CircuitOpenError",
    "ConcurrencyLimiter",
    "CorruptEntryError",
    "EventSink",
    "EventSinkError",
    "FatalLLMError",
    "GovernedLLMClient",
    "LLMConfigError",
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
    "client_from_settings",
    "is_overload_signal",
    "is_transient_error",
    "resolve_cache_ttl",
]
