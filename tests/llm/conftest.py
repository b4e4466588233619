"""Fixtures: a live loopback server, a recording sink, clients whose backoff is not slept."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest

from trm_llm.client import GovernedLLMClient
from trm_llm.simulated_server import SimulatedServer


class ListSink:
    """Keeps every event; the test reads them back."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def emit(self, source: str, event_type: str, data: Mapping[str, Any]) -> None:
        self.events.append((source, event_type, dict(data)))

    def of(self, event_type: str) -> list[dict[str, Any]]:
        return [data for _, kind, data in self.events if kind == event_type]


class FakeClock:
    """A settable clock for the breaker and the retry deadline."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def server() -> AsyncIterator[SimulatedServer]:
    async with SimulatedServer() as srv:
        yield srv


@pytest.fixture
def sink() -> ListSink:
    return ListSink()


@pytest.fixture
def sleeps() -> list[float]:
    return []


ClientFactory = Callable[..., GovernedLLMClient]


@pytest.fixture
async def make_client(
    server: SimulatedServer, sink: ListSink, sleeps: list[float]
) -> AsyncIterator[ClientFactory]:
    """Build clients on the live server; backoff sleeps are recorded, not slept."""
    clients: list[GovernedLLMClient] = []

    async def no_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    def build(**kw: Any) -> GovernedLLMClient:
        kw.setdefault("sink", sink)
        kw.setdefault("sleep", no_sleep)
        kw.setdefault("first_token_timeout_s", 5.0)
        kw.setdefault("inter_token_timeout_s", 5.0)
        client = GovernedLLMClient(server.base_url, kw.pop("model", "sim"), **kw)
        clients.append(client)
        return client

    yield build
    for client in clients:
        await client.aclose()


USER = [{"role": "user", "content": "Say hello."}]
