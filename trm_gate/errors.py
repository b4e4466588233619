"""The trm_gate exception tree: every exception trm_gate raises on purpose sits in it.

```
GateError                       base of every error trm_gate raises on purpose
├── GateInputError (ValueError) bad input: parameters (GateConfig, Gate), the pool, ids, grids,
│   │                           NaN, malformed results or records, inconsistent blocks or
│   │                           counts; raised before anything is evaluated or written
│   ├── UnknownStopReasonError  a stop_reason outside the closed set (`STOP_REASONS`), in a
│   │                           result or in `infra_reasons`
│   └── GateSettingsError       `GateSettings` from the environment or a file are invalid (a
│                               value, an unknown key, an unreadable file)
├── ArmResultError              an arm's `evaluate` returned results that do not match the
│                               units it was asked for (missing, extra or foreign units)
└── GateStateError              the gate was driven wrongly: a step after the verdict, or a
    │                           gate id that already has events
    └── GateNotResumableError   `Gate.resume` of a gate that decided, that a live process still
                                runs, that never started, or whose events cannot be replayed
```

Not in the tree, because they are not trm_gate's: whatever an arm's `evaluate` raises propagates
unchanged (so a harness can catch trm_llm's errors directly), and so does a `trm_store.StoreError`
from the event log or the baseline cache.
"""

from __future__ import annotations

__all__ = [
    "ArmResultError",
    "GateError",
    "GateInputError",
    "GateNotResumableError",
    "GateSettingsError",
    "GateStateError",
    "UnknownStopReasonError",
]


class GateError(Exception):
    """Base class: catch this to handle every failure trm_gate reports."""


class GateInputError(GateError, ValueError):
    """An argument or a result is invalid; nothing was evaluated or written because of it."""


class UnknownStopReasonError(GateInputError):
    """A stop_reason trm_gate does not know; guessing could score INFRA as a model failure."""

    def __init__(self, stop_reason: object, known: frozenset[str]) -> None:
        self.stop_reason = stop_reason
        super().__init__(f"unknown stop_reason {stop_reason!r}; known: {', '.join(sorted(known))}")


class ArmResultError(GateError):
    """An arm's evaluate() answered for other units than it was asked for."""


class GateStateError(GateError):
    """The gate was driven out of order (stepped after its verdict, or its id reused)."""


class GateSettingsError(GateInputError):
    """Gate settings (environment, file, overrides) that no gate can be built from."""


class GateNotResumableError(GateStateError):
    """`Gate.resume` refused: the gate decided, is still run by a live process, never started,
    or its recorded blocks do not replay to what they recorded."""
