"""The demo's inputs and results as plain values: what was asked, and what happened."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trm_gate import GateResult
from trm_store.cli.demo.prompts import Prompt
from trm_store.domain.gate_report import GateReport
from trm_store.domain.llm_calls import LLMSourceStats, TokenTotals

__all__ = ["ArmSummary", "DemoOptions", "DemoOutcome", "Endpoint"]


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What `trm demo` was asked for; base_url None = the simulated model."""

    seed: int
    db: str | None = None
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    concurrency: int = 8
    max_tokens: int = 64


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the answers come from; `served_at` is the simulated server's real loopback URL."""

    base_url: str
    model: str
    simulated: bool
    served_at: str | None = None


@dataclass(frozen=True)
class ArmSummary:
    """One arm of the run: its run id, prompt, snapshot, salt, and what it evaluated."""

    run_id: str
    prompt: Prompt
    snapshot: str
    salt: str
    units: list[str]  # units evaluated in this run (baseline: cache misses only)
    questions: int
    stops: dict[str, int]  # stop_reason -> questions
    requeued: int  # calls the open breaker refused, asked again
    last_error: str | None  # the last call failure other than a breaker refusal


@dataclass(frozen=True)
class DemoOutcome:
    """Everything the report shows."""

    result: GateResult
    report: GateReport  # the gate's own report (blocks, log e-value path) from its events
    store_url: str
    cache_path: Path
    endpoint: Endpoint
    workspace: str
    epoch: int
    pool_questions: int
    baseline: ArmSummary
    candidate: ArmSummary
    baseline_cached: int  # baseline units this run added to the baseline cache
    metric_written: bool  # the candidate's dual metric (none if nothing could be graded)
    calls: LLMSourceStats  # the model's calls during the run
    tokens: TokenTotals  # per arm (run) and for the gate
    breaker: list[dict[str, Any]]  # its breaker's transitions during the run
    injected: dict[str, int] | None  # faults the simulated server injected
    events: int
    elapsed_s: float

    @property
    def streams(self) -> list[str]:
        """The streams this run wrote to."""
        streams = [
            f"gate:{self.result.gate_id}",
            f"run:{self.baseline.run_id}",
            f"run:{self.candidate.run_id}",
            f"llm:{self.endpoint.model}",
            f"baseline:{self.baseline.snapshot}",
            f"workspace:{self.workspace}",
        ]
        return [*streams, f"metrics:{self.candidate.run_id}"] if self.metric_written else streams
