"""The words every package shares: how a question ended (the stop reasons, and which of them are
INFRA) and what a valid id is.

A leaf module with no imports of its own, so the gate's pure core can share it with the store's
baseline cache and run log without loading a database library (`trm_store/__init__` is lazy).

| stop_reason      | meaning                                                    | INFRA |
|------------------|------------------------------------------------------------|-------|
| `stop`           | the model finished its answer                              | no    |
| `length`         | the answer hit the token limit (the model's own failure)   | no    |
| `content_filter` | the provider filtered the answer (a property of the model) | no    |
| `tool_calls`     | the model ended its turn with tool calls                   | no    |
| `error`          | the call failed for good (retries exhausted, fatal error)  | yes   |
| `parse_error`    | the harness could not parse or grade the reply             | yes   |

A question's outcome is the pair (correct, stop_reason), and only some pairs mean something: an
INFRA reason has no verdict (`correct` is None: the model was never judged), every other reason
has one (`correct` is True or False). `outcome_problem` is that rule, for every writer and reader
of outcomes (the run log, the baseline cache, the gate). A gate may count other reasons as INFRA
(its `infra_reasons`); the rule takes that set: an `error` or `parse_error` a gate does not count
as INFRA is scored as a wrong answer (`correct=False`), and neither is ever `correct=True`.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import overload

__all__ = [
    "ID_MAX",
    "INFRA_STOP_REASONS",
    "INT32_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "STOP_REASONS",
    "count_problem",
    "exact_int",
    "exact_text",
    "id_problem",
    "outcome_problem",
    "text_problem",
]

INFRA_STOP_REASONS: frozenset[str] = frozenset({"error", "parse_error"})
"""Stop reasons that mean the infrastructure failed, not the model (SPEC §3)."""

STOP_REASONS: frozenset[str] = INFRA_STOP_REASONS | {
    "stop",
    "length",
    "content_filter",
    "tool_calls",
}
"""Every stop reason a question result may carry; the set is closed on purpose."""

ID_MAX = 255
"""The longest id (run, unit, question, workspace, ...) the event models and both backends hold."""


INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
"""The integers both backends hold (SQLite INTEGER, PostgreSQL BIGINT): wider ones are refused."""
INT32_MAX = 2**31 - 1
"""The largest value of an `Integer` column on PostgreSQL (an event's schema version)."""


@overload
def exact_text(value: str) -> str: ...
@overload
def exact_text(value: object) -> object: ...
def exact_text(value: object) -> object:
    """A str subclass's text as a plain `str` (anything else as it is), taken before a value is
    checked and kept: a subclass's own methods (`__eq__`, `isascii`, sqlite3's `__conform__`)
    could pass one text through the checks and have the driver store another."""
    return str.__str__(value) if isinstance(value, str) and type(value) is not str else value


@overload
def exact_int(value: int) -> int: ...
@overload
def exact_int(value: object) -> object: ...
def exact_int(value: object) -> object:
    """An int subclass's value as a plain `int` (a bool, refused as a count, as it is), as
    `exact_text` does for text."""
    if isinstance(value, int) and type(value) not in (int, bool):
        return int.__int__(value)
    return value


def count_problem(value: object, minimum: int = 0, maximum: int = INT64_MAX) -> str | None:
    """Why `value` is not an int in [minimum, maximum] (a position, version, epoch, size), or
    None when it is. `bool` is refused: `True` is not a count. Each caller names the argument
    and raises its own package's typed error."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an int, got {type(value).__name__}"
    if not minimum <= value <= maximum:
        return f"must be between {minimum} and {maximum}, got {value!r:.40}"
    return None


def text_problem(value: object) -> str | None:
    """Why `value` is not text both backends store verbatim (a str that encodes as UTF-8 and
    holds no NUL, which PostgreSQL text refuses), or None when it is."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if "\x00" in value:
        return f"{value!r:.80} contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{value!r:.80} is not valid Unicode (a lone surrogate)"
    return None


def id_problem(value: object, limit: int = ID_MAX, *, printable: bool = True) -> str | None:
    """Why `value` is not a valid id (a non-blank, printable string of at most `limit`
    characters), or None when it is. Each caller raises its own package's typed error.
    `printable=False` lets control characters through (the log's stream ids, kept verbatim)."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value or value.isspace() or len(value) > limit:
        return f"must be a non-blank string of at most {limit} characters"
    if printable and not value.isprintable():
        return f"{value!r:.80} contains control characters"
    return None


def outcome_problem(
    correct: object,
    stop_reason: object,
    infra_reasons: AbstractSet[str] | None = INFRA_STOP_REASONS,
) -> str | None:
    """Why (correct, stop_reason) is not a consistent question outcome, or None when it is.

    Whatever the policy: the reason is one of STOP_REASONS; `correct` is True, False or None; a
    failed call or an unreadable reply (`error`, `parse_error`) is never right (`correct=True`),
    and a model outcome (any other reason) always has a verdict (True or False).
    Under `infra_reasons`, the stop reasons counted as INFRA (a gate's policy; by default
    INFRA_STOP_REASONS, which the run log and the baseline cache use): an `error`/`parse_error`
    counted as INFRA has no verdict (None), one not counted as INFRA is scored as a wrong answer
    (False). `infra_reasons=None`: the policy is not known yet (a gate's `QuestionResult`, folded
    later under its gate's policy), only the rules that hold under every policy are checked.
    A model outcome a policy counts as INFRA keeps its verdict, which that policy ignores.
    Each caller raises its own package's typed error."""
    if not isinstance(stop_reason, str) or stop_reason not in STOP_REASONS:
        return f"unknown stop_reason {stop_reason!r:.80}; known: {', '.join(sorted(STOP_REASONS))}"
    if correct is not None and not isinstance(correct, bool):
        return f"correct must be True, False or None, got {correct!r:.80}"
    if stop_reason not in INFRA_STOP_REASONS:
        if correct is None:
            return (
                f"stop_reason {stop_reason!r} is a model outcome and needs a verdict: "
                "correct must be True or False, got None"
            )
        return None
    if correct is True:
        return (
            f"stop_reason {stop_reason!r} is a failed call or an unreadable reply: "
            "it cannot be correct (correct must be None, or False to score it as wrong)"
        )
    if infra_reasons is None:
        return None
    if stop_reason in infra_reasons and correct is not None:
        return (
            f"stop_reason {stop_reason!r} is an INFRA failure and has no verdict: "
            f"correct must be None, got {correct!r}"
        )
    if stop_reason not in infra_reasons and correct is None:
        return (
            f"stop_reason {stop_reason!r} does not count as INFRA here (INFRA: "
            f"{', '.join(sorted(infra_reasons)) or 'none'}) and has no correct verdict: "
            "give it correct=False (scored as a wrong answer)"
        )
    return None
