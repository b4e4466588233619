"""Argument checks shared by the pure modules; each raises GateInputError naming the argument."""

from __future__ import annotations

import math

from trm_gate.errors import GateInputError
from trm_store.vocabulary import ID_MAX, id_problem

__all__ = ["check_count", "check_id", "check_open_interval", "check_real"]


def check_real(name: str, value: object) -> float:
    """A finite real number (bool refused: True is not a probability)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GateInputError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(value):
        raise GateInputError(f"{name} must be finite, got {value!r}")
    return float(value)


def check_open_interval(name: str, value: object, low: float, high: float) -> float:
    """A finite real strictly between `low` and `high`."""
    x = check_real(name, value)
    if not low < x < high:
        raise GateInputError(f"{name} must be in ({low:g}, {high:g}), got {value!r}")
    return x


def check_count(name: str, value: object, *, minimum: int = 0) -> int:
    """An int >= minimum (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise GateInputError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise GateInputError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_id(name: str, value: object, limit: int = ID_MAX) -> str:
    """An id: a non-blank, printable string of at most `limit` characters (the vocabulary's rule,
    shared with the store's ids; only the error type is the gate's own)."""
    problem = id_problem(value, limit)
    if problem is not None:
        raise GateInputError(f"{name} {problem}")
    assert isinstance(value, str)
    return value
