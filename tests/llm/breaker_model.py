"""The breaker's promise as a reference model, and a stateful machine that holds breakers to it.

The machine drives interleavings of admit / success / failure / probe timeout / clock steps
through one or more breaker handles that share one state (the local breaker; or breakers in two
processes sharing Redis) and checks every answer against `Model`: exactly one probe, only the
probe's own outcome closes or reopens a half-open breaker, open -> closed only through half-open.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

THRESHOLD = 3
COOLDOWN = 10.0


@dataclass
class Ticket:
    """An admitted call, in flight until it reports."""

    probe_token: str | None
    admitted_at: float


@dataclass
class Model:
    state: str = "closed"
    failures: int = 0
    open_until: float = 0.0
    probe: str | None = None  # the live probe's token

    def admit(self, now: float, token: str | None) -> str:
        """What admit must answer: "call", "probe" or "reject" (and the new state)."""
        if self.state == "closed":
            return "call"
        if (self.state == "open" and now < self.open_until) or self.probe is not None:
            return "reject"
        self.state, self.probe = "half_open", token
        return "probe"

    def success(self, ticket: Ticket) -> None:
        if self.state == "closed" or self._is_probe(ticket):
            self.state, self.failures, self.open_until, self.probe = "closed", 0, 0.0, None

    def failure(self, ticket: Ticket, now: float) -> None:
        self.failures += 1
        if self._is_probe(ticket) or (self.state == "closed" and self.failures >= THRESHOLD):
            self.state, self.open_until, self.probe = "open", now + COOLDOWN, None

    def _is_probe(self, ticket: Ticket) -> bool:
        return self.state == "half_open" and ticket.probe_token == self.probe is not None


class Handle(Protocol):
    """One breaker, as the machine drives it; outcomes carry the admission's probe token."""

    def admit(self, now: float) -> tuple[bool, str | None, tuple[str, str] | None]: ...
    def success(self, now: float, token: str | None) -> tuple[str, str] | None: ...
    def failure(self, now: float, token: str | None) -> tuple[str, str] | None: ...
    def snapshot(self, now: float) -> tuple[str, int]: ...


class BreakerMachine(RuleBasedStateMachine):
    """Subclasses fill `handles` (breakers sharing one state) and define `expire_probe`."""

    def __init__(self) -> None:
        super().__init__()
        self.handles: list[Handle] = []
        self.model = Model()
        self.now = 0.0
        self.in_flight: list[Ticket] = []
        self.changes: list[tuple[str, str]] = []

    def expire_probe(self) -> None:
        raise NotImplementedError

    def _handle(self, data: Any) -> Handle:
        return self.handles[data.draw(st.integers(0, len(self.handles) - 1))]

    @rule(step=st.sampled_from([0.0, 0.5, 3.0, COOLDOWN]))
    def tick(self, step: float) -> None:
        self.now += step

    @rule(data=st.data())
    def admit(self, data: Any) -> None:
        allowed, token, change = self._handle(data).admit(self.now)
        expected = self.model.admit(self.now, token)
        got = "reject" if not allowed else ("probe" if token else "call")
        assert got == expected, (got, expected)
        if change:
            self.changes.append(change)
        if allowed:
            self.in_flight.append(Ticket(token, self.now))

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data(), succeeded=st.booleans())
    def report(self, data: Any, succeeded: bool) -> None:
        ticket = self.in_flight.pop(data.draw(st.integers(0, len(self.in_flight) - 1)))
        handle = self._handle(data)  # any process may report a ticket
        if succeeded:
            change = handle.success(self.now, ticket.probe_token)
            self.model.success(ticket)
        else:
            change = handle.failure(self.now, ticket.probe_token)
            self.model.failure(ticket, self.now)
        if change:
            self.changes.append(change)

    @precondition(lambda self: self.model.probe is not None)
    @rule()
    def probe_times_out(self) -> None:
        self.expire_probe()
        self.model.probe = None

    @invariant()
    def agrees_with_the_model(self) -> None:
        if self.handles:
            got = self.handles[0].snapshot(self.now)
            assert got == (self.model.state, self.model.failures), (got, self.model)

    @invariant()
    def open_closes_only_through_half_open(self) -> None:
        assert ("open", "closed") not in self.changes
        assert ("closed", "half_open") not in self.changes
