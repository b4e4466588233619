"""The demo's bundled validation pool: 288 questions with known answers in 72 units.

Nine task kinds (arithmetic, strings, lists), eight units of each, four questions per unit; a
unit's questions share a kind and a difficulty, so a unit is a small "skill" and its score the
share of its questions answered right. Generated from a fixed seed, so every `trm demo` and every
machine sees the same pool; `POOL_VERSION` names it in the baseline snapshot key.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

__all__ = ["KINDS", "POOL_VERSION", "Pool", "Question", "demo_pool"]

POOL_VERSION = "pool-v1"
UNITS_PER_KIND = 8
QUESTIONS_PER_UNIT = 4
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "be", "do", "fu", "ga", "pe", "zo")


@dataclass(frozen=True, slots=True)
class Question:
    """One question: its text (what the model sees) and its known answer."""

    question_id: str
    unit_id: str
    kind: str
    text: str
    answer: str


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables))


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _numbers(rng: random.Random, level: int) -> list[int]:
    count = 3 + level // 2
    return rng.sample(range(1, 10 ** (1 + level // 3)), count)


def _add(rng: random.Random, level: int) -> tuple[str, str]:
    a, b = _number(rng, 1 + level // 2), _number(rng, 1 + level // 2)
    return f"What is {a} + {b}?", str(a + b)


def _sub(rng: random.Random, level: int) -> tuple[str, str]:
    a, b = sorted((_number(rng, 2 + level // 2), _number(rng, 1 + level // 2)), reverse=True)
    return f"What is {a} - {b}?", str(a - b)


def _mul(rng: random.Random, level: int) -> tuple[str, str]:
    a, b = _number(rng, 1 + level // 3), _number(rng, 1 + (level + 1) // 3)
    return f"What is {a} * {b}?", str(a * b)


def _digit_sum(rng: random.Random, level: int) -> tuple[str, str]:
    n = _number(rng, 3 + level)
    return f"What is the sum of the digits of {n}?", str(sum(int(d) for d in str(n)))


def _reverse(rng: random.Random, level: int) -> tuple[str, str]:
    word = _word(rng, 2 + level // 2)
    return f"Reverse the word '{word}'.", word[::-1]


def _count_letter(rng: random.Random, level: int) -> tuple[str, str]:
    word = _word(rng, 3 + level // 2)
    letter = rng.choice(word)
    return f"How many times does the letter '{letter}' appear in '{word}'?", str(word.count(letter))


def _vowels(rng: random.Random, level: int) -> tuple[str, str]:
    word = _word(rng, 2 + level // 2)
    return f"How many vowels (a, e, i, o, u) are in '{word}'?", str(sum(c in "aeiou" for c in word))


def _sort(rng: random.Random, level: int) -> tuple[str, str]:
    numbers = _numbers(rng, level)
    listed = ", ".join(map(str, numbers))
    return (
        f"Sort these numbers from smallest to largest: {listed}.",
        ", ".join(map(str, sorted(numbers))),
    )


def _max(rng: random.Random, level: int) -> tuple[str, str]:
    numbers = _numbers(rng, level)
    listed = ", ".join(map(str, numbers))
    return f"Which is the largest of these numbers: {listed}?", str(max(numbers))


KINDS: dict[str, Callable[[random.Random, int], tuple[str, str]]] = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "digitsum": _digit_sum,
    "reverse": _reverse,
    "count": _count_letter,
    "vowels": _vowels,
    "sort": _sort,
    "max": _max,
}
"""Task kind -> generator of (question text, answer) at a difficulty level 0..7."""


@dataclass(frozen=True)
class Pool:
    """The questions, in unit order; `units()` lists unit ids, `unit(id)` a unit's questions."""

    version: str
    questions: tuple[Question, ...]
    _units: dict[str, tuple[Question, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grouped: dict[str, list[Question]] = {}
        for q in self.questions:
            grouped.setdefault(q.unit_id, []).append(q)
        object.__setattr__(self, "_units", {u: tuple(qs) for u, qs in grouped.items()})

    def units(self) -> list[str]:
        """Every unit id, in pool order."""
        return list(self._units)

    def unit(self, unit_id: str) -> tuple[Question, ...]:
        """The questions of one unit (KeyError for an unknown unit)."""
        return self._units[unit_id]


@cache
def demo_pool() -> Pool:
    """The pool (built once per process, always the same)."""
    rng = random.Random(f"trm-demo/{POOL_VERSION}")
    questions = []
    for kind, make in KINDS.items():
        for level in range(UNITS_PER_KIND):
            unit_id = f"{kind}-{level:02d}"
            seen: set[str] = set()
            while len(seen) < QUESTIONS_PER_UNIT:
                text, answer = make(rng, level)
                if text in seen:
                    continue
                seen.add(text)
                questions.append(Question(f"{unit_id}-q{len(seen)}", unit_id, kind, text, answer))
    return Pool(POOL_VERSION, tuple(questions))
