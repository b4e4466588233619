"""`GovernedLLMClient`: the public face and the HTTP side of a governed chat completion.

It holds the configuration and sends one streamed request per attempt (`trm_llm.stream`); the
governance around the attempts (cache, breaker, retries, events) is `trm_llm.governor`. The SSE
stall timers run on the event loop's clock; the retry deadline and the breaker use `clock`
(wall time by default, which a Redis-shared breaker needs).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

import httpx
from pydantic import SecretStr

from trm_llm.api_key import Redactor, check_api_key, scrub_exception
from trm_llm.breaker import CircuitBreaker
from trm_llm.cache import ResponseCache
from trm_llm.closing import AsyncClosing
from trm_llm.errors import LLMConfigError
from trm_llm.governor import Governor
from trm_llm.limiter import ConcurrencyLimiter
from trm_llm.protocols import ChatResult, EventSink
from trm_llm.retry import RetryPolicy
from trm_llm.sse import StreamResult, get_profile
from trm_llm.stream import StreamTiming, stream_chat

__all__ = ["ChatResult", "GovernedLLMClient"]

_RESERVED = frozenset({"model", "messages", "stream"})
_DEFAULT_TIMEOUT = httpx.Timeout(30.0, read=None)  # reads are policed by the stall timers


class GovernedLLMClient(AsyncClosing):
    """An `LLMProvider` for any OpenAI-compatible `/chat/completions` endpoint (async).

    `limiter` bounds and learns the calls in flight to the endpoint (`ConcurrencyLimiter`;
    share one between clients of the same endpoint); None sends every call at once.
    `client_from_settings` always gives one. `close_with`: what `aclose` closes too (what a
    builder opened for this client)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: SecretStr | str | None = None,
        cache: ResponseCache | None = None,
        breaker: CircuitBreaker | None = None,
        retry: RetryPolicy | None = None,
        sink: EventSink | None = None,
        http: httpx.AsyncClient | None = None,
        profile: str = "strict",
        source: str | None = None,
        limiter: ConcurrencyLimiter | None = None,
        close_with: Sequence[Callable[[], Awaitable[None]]] = (),
        cache_length: bool = False,
        first_token_timeout_s: float = 60.0,
        inter_token_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if not model:
            raise LLMConfigError("model must be a non-empty string")
        if not first_token_timeout_s > 0 or not inter_token_timeout_s > 0:
            raise LLMConfigError("first_token_timeout_s and inter_token_timeout_s must be > 0")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.source = source or model
        self._url = f"{self.base_url}/chat/completions"
        self._endpoint = str(httpx.URL(self.base_url).copy_with(userinfo=b""))
        self._key = api_key if isinstance(api_key, SecretStr | None) else SecretStr(api_key)
        if self._key is not None:
            check_api_key(self._key.get_secret_value())
        self._redact = Redactor(None if self._key is None else self._key.get_secret_value())
        self._profile = get_profile(profile)
        self._owns_http = http is None
        self._close_with = tuple(close_with)
        self.breaker, self.limiter = breaker, limiter
        self._http = http or httpx.AsyncClient(timeout=_DEFAULT_TIMEOUT)
        self._first_token_s = first_token_timeout_s
        self._inter_token_s = inter_token_timeout_s
        self._governor = Governor(
            model=model,
            source=self.source,
            endpoint=self.base_url,
            shown_endpoint=self._endpoint,
            profile=self._profile.name,
            attempt=self._stream_once,
            redact=self._redact,
            cache=cache,
            breaker=breaker,
            limiter=limiter,
            retry=retry or RetryPolicy(),
            sink=sink,
            cache_length=cache_length,
            clock=clock,
            sleep=sleep,
            rand=rand,
        )

    def __repr__(self) -> str:
        return (
            f"GovernedLLMClient({self._endpoint!r}, {self.model!r}, profile={self._profile.name!r})"
        )

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it, then what `close_with` names."""
        async with AsyncExitStack() as stack:  # each runs, whatever the others raise
            for close in self._close_with:
                stack.push_async_callback(close)
            if self._owns_http:
                stack.push_async_callback(self._http.aclose)

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        parent_call_id: str | None = None,
        cache_salt: str | None = None,
        **params: Any,
    ) -> ChatResult:
        """One completion; raises an `LLMError` subclass unless a complete answer came back."""
        reserved = _RESERVED.intersection(params)
        if reserved:
            raise LLMConfigError(f"{sorted(reserved)} cannot be passed as params")
        return await self._governor.run(messages, params, parent_call_id, cache_salt)

    async def _stream_once(self, body: dict[str, Any], timing: StreamTiming) -> StreamResult:
        """One attempt; the key is read here only, into the Authorization header (checked to be
        a valid header value when the client was built)."""
        headers = {}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key.get_secret_value()}"
        try:
            return await stream_chat(
                self._http,
                self._url,
                headers,
                body,
                self._profile,
                first_token_s=self._first_token_s,
                inter_token_s=self._inter_token_s,
                timing=timing,
            )
        except BaseException as exc:
            # A server may echo the key in an error it streams or returns: scrub the messages
            # here, where every attempt's error passes, before anything can show or store it.
            scrub_exception(exc, self._redact)
            raise
