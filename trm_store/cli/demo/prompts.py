"""The demo's two prompts and the grader: what the arms ask, and how an answer is scored.

The baseline is a plain system prompt; the candidate adds some of the simulated model's
`PROMPT_HINTS`, picked by the seed (so each seed has its own, fixed, candidate). Most picks help;
the `brief` hint hurts, so a few seeds get a weaker candidate.

Each question states the answer format and comes after one worked example (an earlier user and
assistant turn), so a small real model sees what a reply looks like; the grader is
`trm_gate.ShortAnswerGrader`, which also reads what such models write instead (a bare number or
word, "three times", "the answer is 12", a final number after some working). A reply it cannot
read is a `parse_error`, which the gate counts as INFRA, never as a wrong answer. The example
turns come before the question, so the simulated model (it reads the last user message) answers
exactly as it would without them.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from trm_gate import ShortAnswerGrader
from trm_store.cli.demo.model import PROMPT_HINTS

__all__ = [
    "BASELINE_PROMPT",
    "GRADER",
    "GRADER_VERSION",
    "Prompt",
    "baseline_prompt",
    "candidate_prompt",
    "messages",
]

BASELINE_PROMPT = "You are a careful assistant. Answer the user's question."
GRADER = ShortAnswerGrader()
GRADER_VERSION = GRADER.version  # in the snapshot: a new grader never meets the old cache
_SKILL_HINTS = ("steps", "letters", "compare")
_FORMAT = "Give your final answer on the last line as 'ANSWER: <answer>'."
_EXAMPLE = (
    "How many times does the letter 'o' appear in 'tomato'?",
    "'tomato' has o twice.\nANSWER: 2",
)


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
    """The chat messages for one question: the system prompt, one worked example, the question."""
    example, reply = _EXAMPLE
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"{example}\n{_FORMAT}"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": f"{question}\n{_FORMAT}"},
    ]
