"""Exactly one probe, for every interleaving: the local breaker held to the reference model."""

from __future__ import annotations

from hypothesis import settings

from trm_llm.breaker import Admission, CircuitBreaker

from .breaker_model import COOLDOWN, THRESHOLD, BreakerMachine

PROBE_TIMEOUT = 1e6  # a probe times out only when the machine says so (a jump of the clock)


class LocalHandle:
    """The in-memory breaker through its synchronous API, tickets passed with each outcome."""

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.breaker = breaker

    def admit(self, now: float) -> tuple[bool, str | None, tuple[str, str] | None]:
        a = self.breaker.admit("p", now)
        t = a.transition
        return a.allowed, a.probe_token, (t.from_state, t.to_state) if t else None

    def success(self, now: float, token: str | None) -> tuple[str, str] | None:
        t = self.breaker.record_success("p", now=now, admission=Admission(True, token))
        return (t.from_state, t.to_state) if t else None

    def failure(self, now: float, token: str | None) -> tuple[str, str] | None:
        t = self.breaker.record_failure("p", now, admission=Admission(True, token))
        return (t.from_state, t.to_state) if t else None

    def snapshot(self, now: float) -> tuple[str, int]:
        s = self.breaker.snapshot("p", now)
        return s.state, s.failures


class LocalBreakerMachine(BreakerMachine):
    def __init__(self) -> None:
        super().__init__()
        breaker = CircuitBreaker(THRESHOLD, COOLDOWN, PROBE_TIMEOUT)
        self.handles = [LocalHandle(breaker)]

    def expire_probe(self) -> None:
        self.now += PROBE_TIMEOUT


LocalBreakerMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
TestLocalBreaker = LocalBreakerMachine.TestCase
