"""What the soak's supervisor, workers and checker share: the run's settings, the endpoint's
prompts and parameters, the fault-injecting server, and line-by-line side files.

The side files are how a worker that is SIGKILLed at any moment still tells the checker what it
was told: each line is written with one `os.write` on an `O_APPEND` descriptor straight after the
call it reports returned, so a line is either whole on disk or absent.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trm_llm.simulated_server import Reply, stall, status
from trm_store.cli.demo.faults import FaultPlan
from trm_store.cli.demo.model import SimulatedModel
from trm_store.cli.demo.prompts import Prompt, baseline_prompt, candidate_prompt
from trm_store.cli.demo.server import DemoServer

__all__ = [
    "BASELINES",
    "CANDIDATES",
    "PARAMS",
    "SEED",
    "LineLog",
    "OutageServer",
    "SoakConfig",
    "read_lines",
]

SEED = 3
PARAMS: dict[str, Any] = {"temperature": 0, "max_tokens": 64}
BASELINES: tuple[Prompt, ...] = (baseline_prompt(), candidate_prompt(11), candidate_prompt(12))
"""Baseline arms rotate over a few snapshots, so the baseline cache is both hit and filled."""
CANDIDATES: tuple[Prompt, ...] = tuple(candidate_prompt(s) for s in range(1, 9))


@dataclass(frozen=True)
class SoakConfig:
    """One backend's soak, handed to every worker and the follower as a JSON file."""

    backend: str
    store_url: str
    redis_url: str
    namespace: str  # Redis key prefix of this soak (cache and breaker under it)
    base_url: str  # the fault-injecting server, real loopback port
    model: str
    workdir: str  # side files: acks-*, probes-*, follower
    units: int  # units per gate
    block_size: int
    probe_timeout_s: float

    @property
    def cache_namespace(self) -> str:
        return f"{self.namespace}:cache"

    @property
    def breaker_namespace(self) -> str:
        return f"{self.namespace}:breaker"

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: str) -> SoakConfig:
        return cls(**json.loads(Path(path).read_text()))


class OutageServer(DemoServer):
    """The demo's server (simulated model, byte-level faults) with an outage every `every_s`
    seconds for `outage_s` (half the requests 503, half hang with no first token), so the shared
    breaker opens, probes and closes many times, and a probe is sometimes out for a while."""

    def __init__(self, *, every_s: float, outage_s: float) -> None:
        plan = FaultPlan(SEED, 1, outage_after=10**12)  # the demo's one-off outage: replaced
        super().__init__(SimulatedModel(SEED), plan, stall_s=1.5)
        self.every_s, self.outage_s = every_s, outage_s
        self._t0 = time.monotonic()

    def respond(self, body: Any) -> Reply:
        if (time.monotonic() - self._t0) % self.every_s < self.every_s - self.outage_s:
            return super().respond(body)
        if self.request_count % 2:  # half the outage hangs: a probe then stays out a while
            self.injected["outage_hang"] += 1
            return stall(self.stall_s)
        self.injected["outage_503"] += 1
        return status(503)


class LineLog:
    """Append-only JSON lines, each one `os.write` (no user-space buffer a kill could drop)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def read_lines(directory: Path, pattern: str) -> list[dict[str, Any]]:
    """Every whole line of the side files matching `pattern` (a torn last line is skipped)."""
    records = []
    for path in sorted(directory.glob(pattern)):
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
