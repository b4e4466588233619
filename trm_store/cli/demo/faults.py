"""The fault schedule of the demo's simulated server: which request gets which failure.

A pure function of (seed, epoch, request body, attempt number at that body), so which question
is hit does not depend on the order concurrent requests arrive in, and the next epoch meets
different faults. Per attempt, about one in six fails in one of the ways the governed client
must survive (`RATES`); a few bodies (`sticky_rate`) are refused with a 400 on every attempt,
which no retry can fix, so the question ends as INFRA `error` at once (a request that failed
transiently on every attempt would, as the breaker's half-open probe, keep the breaker open for
everyone); and once, after `outage_after` requests, the server answers
503 to everything for `outage_s` seconds, long enough for the circuit breaker to open, probe and
close again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

__all__ = ["RATES", "FaultKind", "FaultPlan"]

FaultKind = Literal[
    "cut",
    "reset",
    "rate_limit",
    "stall_first",
    "stall_inter",
    "error_payload",
    "server_error",
    "bad_request",
]

RATES: tuple[tuple[FaultKind, float], ...] = (
    ("cut", 0.05),  # the stream ends before [DONE]
    ("reset", 0.03),  # TCP reset mid-stream
    ("rate_limit", 0.025),  # 429 with Retry-After
    ("stall_first", 0.015),  # no first token in time
    ("stall_inter", 0.015),  # tokens stop mid-answer
    ("error_payload", 0.02),  # a 200 stream that turns into {"error": ...}
    ("server_error", 0.01),  # 500
)
"""Chance per attempt of each fault (about 16.5% in all)."""


def _draw(*parts: object) -> float:
    """A uniform number in [0, 1) fixed by `parts`."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What to inject; `fault(key, attempt)` decides one request (key: a digest of its body)."""

    seed: int
    epoch: int
    rates: tuple[tuple[FaultKind, float], ...] = RATES
    sticky_rate: float = 0.002
    outage_after: int = 100
    outage_s: float = 1.2

    def sticky(self, key: str) -> bool:
        """True if every attempt at this body is refused (400)."""
        return _draw(self.seed, self.epoch, key, "sticky") < self.sticky_rate

    def fault(self, key: str, attempt: int) -> FaultKind | None:
        """The fault for this attempt at this body, or None for a clean answer."""
        if self.sticky(key):
            return "bad_request"
        u, total = _draw(self.seed, self.epoch, key, attempt), 0.0
        for kind, rate in self.rates:
            total += rate
            if u < total:
                return kind
        return None
