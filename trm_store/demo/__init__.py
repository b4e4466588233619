"""`trm demo`: one gated epoch end to end on a bundled pool, against a real or simulated model."""

from trm_store.demo.pool import Pool, Question, demo_pool
from trm_store.demo.run import DemoOptions, DemoOutcome, Endpoint, run_demo

__all__ = ["DemoOptions", "DemoOutcome", "Endpoint", "Pool", "Question", "demo_pool", "run_demo"]
