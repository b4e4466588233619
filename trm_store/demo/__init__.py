"""`trm demo`: one gated epoch end to end on a bundled pool, against a real or simulated model."""

from trm_store.demo.outcome import ArmSummary, DemoOptions, DemoOutcome, Endpoint
from trm_store.demo.pool import Pool, Question, demo_pool
from trm_store.demo.report import print_report, summary
from trm_store.demo.run import run_demo

__all__ = [
    "ArmSummary",
    "DemoOptions",
    "DemoOutcome",
    "Endpoint",
    "Pool",
    "Question",
    "demo_pool",
    "print_report",
    "run_demo",
    "summary",
]
