"""The tiers of `trm diagnose`: the list a user gives, and the tier read from an LLM's answer.

An answer's tier is its first word if that is a tier, else the one tier it names; an answer that
names none, or several, is `uncertain` (`Parsed.how` says which), text inside `<think>` aside.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from trm_store.domain.diagnosis import UNCERTAIN
from trm_store.domain.errors import DiagnoseInputError

__all__ = ["DEFAULT_TIERS", "Parsed", "parse_tier", "parse_tiers"]

DEFAULT_TIERS = ("correct", "wrong", UNCERTAIN)

_WORD = re.compile(r"[a-z0-9]+(?:[-_][a-z0-9]+)*")
"""A word of an answer, and the shape of a tier: `_` and `-` only inside (`_wrong_` is emphasis)."""
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def parse_tiers(text: str) -> tuple[str, ...]:
    """A comma-separated tier list: two or more distinct lower-case words, `uncertain` included."""
    tiers = tuple(t.strip() for t in text.split(","))
    bad = [t for t in tiers if not _WORD.fullmatch(t) or len(t) > 64]
    if bad:
        raise DiagnoseInputError(
            f"tiers must be lower-case words of a-z, 0-9 and inner _ or - (at most 64 "
            f"characters), got {bad}"
        )
    if len(set(tiers)) != len(tiers) or len(tiers) < 2 or UNCERTAIN not in tiers:
        raise DiagnoseInputError(
            f"tiers must be at least two distinct names including {UNCERTAIN!r}, got {list(tiers)}"
        )
    return tiers


@dataclass(frozen=True, slots=True)
class Parsed:
    """The tier read from an answer and how: `first_word`, `only_tier`, `ambiguous` (several
    tiers named) or `unparseable` (none); the last two give `uncertain`."""

    tier: str
    how: str


def parse_tier(answer: str, tiers: Sequence[str]) -> Parsed:
    """The answer's tier: its first word if that is a tier, else the one tier it names."""
    words = _WORD.findall(_THINK.sub(" ", answer).lower())
    if words and words[0] in tiers:
        return Parsed(words[0], "first_word")
    named = {w for w in words if w in tiers}
    if len(named) == 1:
        return Parsed(named.pop(), "only_tier")
    return Parsed(UNCERTAIN, "ambiguous" if named else "unparseable")
