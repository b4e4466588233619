"""The demo's loopback endpoint: `trm_llm`'s SimulatedServer answering as the simulated model,
with the fault plan's failures injected at the byte level.

It counts what it injected (`injected`), so the report can set what was thrown at the client
beside what the client's events say it caught. The client addresses it by a fixed name,
`SIMULATED_BASE_URL`, routed to whatever loopback port it got (`loopback_http`): the response
cache keys on the endpoint, and a port that changes every run would make every run miss.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from typing import Any

import httpx

from trm_llm.simulated_server import (
    Reply,
    SimulatedServer,
    cut,
    error_payload,
    normal,
    reset,
    stall,
    status,
)
from trm_store.cli.demo.faults import FaultKind, FaultPlan
from trm_store.cli.demo.model import SimulatedModel

__all__ = ["SIMULATED_BASE_URL", "DemoServer", "loopback_http"]

SIMULATED_BASE_URL = "http://simulated-model.invalid/v1"
"""The simulated endpoint's stable name (`.invalid` never resolves: nothing else can answer)."""


class DemoServer(SimulatedServer):
    """A SimulatedServer whose default reply is the simulated model's answer, faults included."""

    def __init__(self, model: SimulatedModel, plan: FaultPlan, *, stall_s: float) -> None:
        super().__init__()
        self.model = model
        self.plan = plan
        self.stall_s = stall_s
        self.injected: Counter[str] = Counter()
        self._attempts: Counter[str] = Counter()
        self._outage_until: float | None = None

    def respond(self, body: Any) -> Reply:
        chat = body.get("messages") if isinstance(body, dict) else None
        key = hashlib.sha256(json.dumps(chat, sort_keys=True).encode()).hexdigest()
        self._attempts[key] += 1
        if self._in_outage():
            self.injected["outage_503"] += 1
            return status(503)
        fault = self.plan.fault(key, self._attempts[key])
        system, user = _texts(chat)
        text = self.model.reply(system, user)
        if fault is None:
            return normal(_tokens(text))
        self.injected[fault] += 1
        return self._faulty(fault, text)

    def _in_outage(self) -> bool:
        now = asyncio.get_running_loop().time()
        if self._outage_until is None and self.request_count > self.plan.outage_after:
            self._outage_until = now + self.plan.outage_s
        return self._outage_until is not None and now < self._outage_until

    def _faulty(self, fault: FaultKind, text: str) -> Reply:
        if fault == "cut":
            return cut(after=2)
        if fault == "reset":
            return reset(after=2)
        if fault == "rate_limit":
            return status(429, retry_after="1")
        # After a stall the answer comes in one piece: the client has given up by then, and
        # few writes to its closed socket keep asyncio from logging each one.
        if fault == "stall_first":
            return stall(self.stall_s, then=normal([text], usage=False))
        if fault == "stall_inter":
            return stall(self.stall_s, after=2, then=normal([text], usage=False))
        if fault == "error_payload":
            return error_payload("error")
        if fault == "bad_request":
            return status(400, {"error": {"message": "simulated: this request is refused"}})
        return status(500)


def _texts(chat: Any) -> tuple[str, str]:
    """(system prompt, last user message) of a chat request."""
    system = user = ""
    for message in chat if isinstance(chat, list) else []:
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            if message.get("role") == "system":
                system = message["content"]
            elif message.get("role") == "user":
                user = message["content"]
    return system, user


def _tokens(text: str) -> list[str]:
    """The reply split into word-sized stream chunks."""
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


class _Loopback(httpx.AsyncBaseTransport):
    """Sends every request to 127.0.0.1:`port`, whatever host the URL names."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.url = request.url.copy_with(host="127.0.0.1", port=self._port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def loopback_http(server: DemoServer) -> httpx.AsyncClient:
    """An HTTP client for `SIMULATED_BASE_URL` that reaches `server` (reads policed by the
    governed client's stall timers, as with its own default client)."""
    return httpx.AsyncClient(
        transport=_Loopback(server.port), timeout=httpx.Timeout(30.0, read=None)
    )
