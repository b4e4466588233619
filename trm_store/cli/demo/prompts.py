"""The demo's two prompts and the grader: what the arms ask, and how an answer is scored.

The baseline is a plain system prompt; the candidate adds some of the simulated model's
`PROMPT_HINTS`, picked by the seed (so each seed has its own, fixed, candidate). Most picks help;
the `brief` hint hurts, so a few seeds get a weaker candidate. The grader reads the last
`ANSWER: ...` line (any case, markdown emphasis allowed) or a reply that is nothing but a short
answer; a reply it cannot read is a
`parse_error`, which the gate counts as INFRA, never as a wrong answer.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from trm_store.cli.demo.model import PROMPT_HINTS

__all__ = [
    "BASELINE_PROMPT",
    "GRADER_VERSION",
    "Graded",
    "Prompt",
    "baseline_prompt",
    "candidate_prompt",
    "grade",
    "messages",
]

BASELINE_PROMPT = "You are a careful assistant. Answer the user's question."
GRADER_VERSION = "grader-v1"
_SKILL_HINTS = ("steps", "letters", "compare")
# "ANSWER: x", also as real models write it: "Answer: x", "**ANSWER:** x"
_ANSWER_LINE = re.compile(r"^[\s*_#>]*answer[\s*_]*:[\s*_]*(.+?)[\s*_]*$", re.I | re.M)
_SHORT = 32  # a bare reply up to this long is taken as the answer itself


@dataclass(frozen=True, slots=True)
class Prompt:
    """A system prompt, its version (a digest of the text) and the hints it holds."""

    text: str
    hints: tuple[str, ...]

    @property
    def version(self) -> str:
        return "p-" + hashlib.sha256(self.text.encode()).hexdigest()[:8]


def baseline_prompt() -> Prompt:
    return Prompt(BASELINE_PROMPT, ())


def candidate_prompt(seed: int) -> Prompt:
    """The seed's candidate: two or three skill hints, maybe the format hint, rarely `brief`."""
    rng = random.Random(f"trm-demo/candidate/{seed}")
    hints = rng.sample(_SKILL_HINTS, 3 if rng.random() < 0.75 else 2)
    if rng.random() < 0.5:
        hints.append("format")
    if rng.random() < 0.2:
        hints.append("brief")
    chosen = tuple(h for h in PROMPT_HINTS if h in hints)  # a fixed order, whatever the draw
    text = " ".join([BASELINE_PROMPT, *(PROMPT_HINTS[h].text for h in chosen)])
    return Prompt(text, chosen)


def messages(system: str, question: str) -> list[dict[str, str]]:
    """The chat messages for one question."""
    return [
        {"role": "system", "content": system},
        {
            "role": "user",
            "content": f"{question}\nGive your final answer on the last line as "
            "'ANSWER: <answer>'.",
        },
    ]


@dataclass(frozen=True, slots=True)
class Graded:
    """The answer read from a reply (None if unreadable) and whether it is right."""

    prediction: str | None
    correct: bool | None


def _normalise(answer: str) -> str:
    text = answer.strip().strip("'\"`").rstrip(".").strip().lower()
    return re.sub(r"\s*,\s*", ", ", re.sub(r"\s+", " ", text))


def grade(reply: str, expected: str) -> Graded:
    """Read the answer out of `reply` and compare it with `expected`."""
    found = _ANSWER_LINE.findall(reply)
    if found:
        answer = found[-1]
    elif reply.strip() and "\n" not in reply.strip() and len(reply.strip()) <= _SHORT:
        answer = reply.strip()
    else:
        return Graded(None, None)
    return Graded(answer, _normalise(answer) == _normalise(expected))
