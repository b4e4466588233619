"""The simulated model behind the demo's loopback server: a stand-in for an LLM at temperature 0.

It reads the question out of the last user message (it knows the nine task kinds of the pool by
their wording, not the pool itself), solves it, and answers right with a probability set by the
task kind, the size of the task and the system prompt: each `PROMPT_HINTS` sentence present in
the system prompt moves the accuracy of some task groups (or, for `format`, how often the model
rambles without an answer line, which the grader cannot parse). Every draw is seeded by
(model seed, system prompt, user message), so the same request always gets the same answer.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["MODEL_VERSION", "PROMPT_HINTS", "Hint", "SimulatedModel", "Solved", "solve"]

MODEL_VERSION = "sim1"
_MIN_P, _MAX_P = 0.02, 0.97
_GARBLE = 0.003
_PER_CHAR = 0.02  # accuracy lost per operand character beyond the first two


@dataclass(frozen=True, slots=True)
class Hint:
    """A system-prompt sentence the simulated model reacts to."""

    text: str
    boost: dict[str, float] = field(default_factory=dict)  # task group -> accuracy change
    garble_factor: float = 1.0


PROMPT_HINTS: dict[str, Hint] = {
    "steps": Hint("Work through the problem step by step before you answer.", {"arith": 0.33}),
    "letters": Hint("Go through each word one letter at a time.", {"strings": 0.33}),
    "compare": Hint("Compare every number in a list before you answer.", {"lists": 0.33}),
    "format": Hint(
        "Finish with exactly one line 'ANSWER: <answer>' and nothing after it.",
        garble_factor=0.25,
    ),
    "brief": Hint("Keep it short.", {"arith": -0.08, "strings": -0.08, "lists": -0.08}),
}

_BASE = {
    "add": 0.70,
    "sub": 0.65,
    "mul": 0.50,
    "digitsum": 0.55,
    "reverse": 0.60,
    "count": 0.55,
    "vowels": 0.60,
    "sort": 0.50,
    "max": 0.70,
}
_GROUP = {
    "add": "arith",
    "sub": "arith",
    "mul": "arith",
    "digitsum": "arith",
    "reverse": "strings",
    "count": "strings",
    "vowels": "strings",
    "sort": "lists",
    "max": "lists",
}


@dataclass(frozen=True, slots=True)
class Solved:
    """What the model made of a question: its kind, the right answer, the operand size."""

    kind: str
    answer: str
    size: int


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def _listed(text: str) -> Solved:
    numbers = _numbers(text)
    return Solved("sort", ", ".join(map(str, sorted(numbers))), sum(len(str(n)) for n in numbers))


_SOLVERS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], Solved]], ...] = (
    (
        re.compile(r"What is (\d+) \+ (\d+)\?"),
        lambda m: Solved("add", str(int(m[1]) + int(m[2])), len(m[1]) + len(m[2])),
    ),
    (
        re.compile(r"What is (\d+) - (\d+)\?"),
        lambda m: Solved("sub", str(int(m[1]) - int(m[2])), len(m[1]) + len(m[2])),
    ),
    (
        re.compile(r"What is (\d+) \* (\d+)\?"),
        lambda m: Solved("mul", str(int(m[1]) * int(m[2])), 2 * (len(m[1]) + len(m[2]))),
    ),
    (
        re.compile(r"sum of the digits of (\d+)\?"),
        lambda m: Solved("digitsum", str(sum(int(d) for d in m[1])), len(m[1])),
    ),
    (
        re.compile(r"Reverse the word '([a-z]+)'"),
        lambda m: Solved("reverse", m[1][::-1], len(m[1])),
    ),
    (
        re.compile(r"letter '([a-z])' appear in '([a-z]+)'"),
        lambda m: Solved("count", str(m[2].count(m[1])), len(m[2])),
    ),
    (
        re.compile(r"How many vowels \(a, e, i, o, u\) are in '([a-z]+)'"),
        lambda m: Solved("vowels", str(sum(c in "aeiou" for c in m[1])), len(m[1])),
    ),
    (re.compile(r"smallest to largest: ([\d, ]+)\."), lambda m: _listed(m[1])),
    (
        re.compile(r"largest of these numbers: ([\d, ]+)\?"),
        lambda m: Solved("max", str(max(_numbers(m[1]))), len(_numbers(m[1]))),
    ),
)


def solve(text: str) -> Solved | None:
    """Recognise and solve a pool question in `text`; None if it is not one."""
    for pattern, solver in _SOLVERS:
        match = pattern.search(text)
        if match:
            return solver(match)
    return None


def _wrong(solved: Solved, rng: random.Random) -> str:
    """A plausible wrong answer, never equal to the right one."""
    answer = solved.answer
    if solved.kind == "sort":
        items = answer.split(", ")
        i = rng.randrange(len(items) - 1)
        items[i], items[i + 1] = items[i + 1], items[i]
        return ", ".join(items)
    if solved.kind == "reverse":
        chars = list(answer)
        i = rng.randrange(len(chars) - 1)
        chars[i], chars[i + 1] = chars[i + 1], chars[i]
        wrong = "".join(chars)
        return wrong if wrong != answer else answer[::-1] + answer[-1]
    value = int(answer) + rng.choice((-10, -2, -1, 1, 2, 10))
    return str(value if value >= 0 and str(value) != answer else int(answer) + 1)


@dataclass(frozen=True, slots=True)
class SimulatedModel:
    """`reply(system, user)` -> the answer text; `accuracy` is the chance it is right."""

    seed: int

    @property
    def name(self) -> str:
        """The model name the demo asks for (its behaviour depends on the seed)."""
        return f"trm-{MODEL_VERSION}-s{self.seed}"

    def accuracy(self, system: str, solved: Solved) -> float:
        p = _BASE[solved.kind] - _PER_CHAR * max(0, solved.size - 2)
        for hint in PROMPT_HINTS.values():
            if hint.text in system:
                p += hint.boost.get(_GROUP[solved.kind], 0.0)
        return min(_MAX_P, max(_MIN_P, p))

    def reply(self, system: str, user: str) -> str:
        solved = solve(user)
        if solved is None:
            return "I do not recognise this kind of question, so I cannot answer it reliably."
        rng = random.Random(f"{MODEL_VERSION}|{self.seed}|{system}|{user}")
        garble = _GARBLE
        for hint in PROMPT_HINTS.values():
            if hint.text in system:
                garble *= hint.garble_factor
        if rng.random() < garble:
            return "Hmm, this one is tricky; I would rather not commit to a single answer here."
        right = rng.random() < self.accuracy(system, solved)
        answer = solved.answer if right else _wrong(solved, rng)
        return f"Let me work this out.\nANSWER: {answer}"
