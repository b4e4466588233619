"""Graders: how a reply becomes a verdict, and the short-answer grader the demo uses.

A grader reads a model's reply to one question and says what answer it found (`prediction`) and
whether it is right (`correct`); a reply it cannot read at all has `correct=None`, which the arm
helper (`trm_gate.asking`) turns into an INFRA `parse_error` result: an unreadable reply says
nothing about the model's skill, so it is never scored as a wrong answer (unless the gate's
`infra_reasons` says otherwise). A grader's `version` belongs in the arm's snapshot: a new grader
may score old replies differently, so it must not meet the old baseline cache.

`ShortAnswerGrader` reads the answers small real models write, not only the format asked for:
an `ANSWER: x` line (any case, markdown allowed), "the answer is x", a bare reply ("12",
"**12**", "olak."), number words ("three times" for 3), and, as a last resort, the last number
(or list of numbers) in the reply when a number (or list) is expected. Pure: no I/O, no store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, TypeVar

__all__ = [
    "AnsweredQuestion",
    "Graded",
    "Grader",
    "ShortAnswerGrader",
    "grade_short_answer",
    "number_in",
]

Q_contra = TypeVar("Q_contra", contravariant=True)


@dataclass(frozen=True, slots=True)
class Graded:
    """The answer read from a reply (None if unreadable) and whether it is right (None: the
    reply could not be read, an INFRA `parse_error`)."""

    prediction: str | None
    correct: bool | None


class Grader(Protocol[Q_contra]):
    """Reads replies to questions of type Q; `version` names its rules (put it in the snapshot)."""

    @property
    def version(self) -> str: ...

    def grade(self, question: Q_contra, reply: str) -> Graded: ...


class AnsweredQuestion(Protocol):
    """A question with one known right answer (what `ShortAnswerGrader` compares against)."""

    @property
    def answer(self) -> str: ...


_WORDS = {
    w: i
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
        ]
    )
}
_TENS = {
    w: 10 * i
    for i, w in enumerate(
        ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
    )
    if i >= 2
}
_ADVERBS = {"once": 1, "twice": 2, "thrice": 3}
_WORD_NUMBER = (
    r"(?:(?:" + "|".join(_TENS) + r")(?:[- ](?:" + "|".join(list(_WORDS)[1:10]) + r"))?"
    r"|" + "|".join(sorted(_WORDS, key=len, reverse=True)) + r"|once|twice|thrice)"
)
_NUMBER = re.compile(
    r"(?<![\w.])(-?\d{1,3}(?:,\d{3})+(?!\d)|-?\d+(?:\.\d+)?)(?![\d])|\b(" + _WORD_NUMBER + r")\b",
    re.I,
)
_LIST = re.compile(r"-?\d+(?:\s*,\s*-?\d+)+")
_ANSWER_LINE = re.compile(
    r"^[\s*_#>-]*(?:final\s+)?answer[\s*_]*[:=][\s*_]*(.+?)[\s*_]*$", re.I | re.M
)
_ANSWER_IS = re.compile(
    r"\b(?:answer|result|word|number|sum|total|count|list|value)s?\b[^\n.]*?\b(?:is|are)"
    r"\s*:?\s*(.+?)\s*(?:[.!]\s*)?$",
    re.I | re.M,
)
_QUOTED = re.compile(r"\*\*([^*\n]+)\*\*|'([^'\n]+)'|\"([^\"\n]+)\"|`([^`\n]+)`")
_SHORT = 40  # a one-line reply up to this long is taken as the answer itself
_IS_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_IS_LIST = re.compile(r"-?\d+(?:, -?\d+)+")


def number_in(text: str, *, pronouns: bool = True) -> str | None:
    """The last number in `text`, digits or words ("three", "twenty-one", "twice"), as digits;
    `pronouns=False` skips a bare "one" ("this one is tricky"), for prose that is not an answer."""
    found: list[tuple[str, str]] = [
        (d, w) for d, w in _NUMBER.findall(text) if pronouns or w.lower() != "one"
    ]
    if not found:
        return None
    digits, words = found[-1]
    if digits:
        return digits.replace(",", "")
    return str(_word_value(words.lower()))


def _word_value(word: str) -> int:
    if word in _ADVERBS:
        return _ADVERBS[word]
    if word in _WORDS:
        return _WORDS[word]
    tens, _, unit = word.replace(" ", "-").partition("-")
    return _TENS[tens] + (_WORDS[unit] if unit else 0)


def _clean(text: str) -> str:
    text = re.sub(r"[*_`]+", "", text).strip()
    return text.strip("'\"").rstrip(".!").strip().strip("'\"").strip()


def _normalise(answer: str) -> str:
    text = _clean(answer).lower()
    return re.sub(r"\s*,\s*", ", ", re.sub(r"\s+", " ", text))


def _same_number(a: str, b: str) -> bool:
    return float(a) == float(b)


@dataclass(frozen=True, slots=True)
class ShortAnswerGrader:
    """Grades a short answer (a number, a list of numbers, a word) against `question.answer`.

    Where it looks, in order: the last `ANSWER:` line; the last "the answer is x"; a one-line
    reply of at most 40 characters; then, for a number or a list of numbers expected, the last
    one in the reply, and for a word, the last one in bold or quotes. A number is compared as a
    number (digits or words), a list element by element, a word without case or quotes.
    """

    version: str = "short-answer-v2"

    def grade(self, question: AnsweredQuestion, reply: str) -> Graded:
        return grade_short_answer(reply, question.answer)


def grade_short_answer(reply: str, expected: str) -> Graded:
    """`ShortAnswerGrader`'s rules, for a reply and the expected answer as text."""
    want = _normalise(expected)
    kind = (
        "list" if _IS_LIST.fullmatch(want) else "number" if _IS_NUMBER.fullmatch(want) else "word"
    )
    stripped = reply.strip()
    spans = [m[-1] for m in (_ANSWER_LINE.findall(reply), _ANSWER_IS.findall(reply)) if m]
    if stripped and "\n" not in stripped and len(stripped) <= _SHORT:
        spans.append(stripped)
    spans.append(reply)  # the last resort: the whole reply
    for i, span in enumerate(spans):
        last_resort = i == len(spans) - 1
        found = _read(span, kind, whole=not last_resort)
        if found is not None:
            return Graded(found, _matches(found, want, kind))
    return Graded(None, None)


def _read(span: str, kind: str, *, whole: bool) -> str | None:
    """The answer of `kind` in `span`; `whole`: the span is meant to be the answer itself."""
    if kind == "list":
        runs = _LIST.findall(span)
        return ", ".join(re.split(r"\s*,\s*", runs[-1])) if runs else None
    if kind == "number":
        return number_in(span, pronouns=whole)
    cleaned = _clean(span)
    if whole and cleaned and len(cleaned.split()) <= 2:
        return cleaned
    quoted = [next(g for g in m if g) for m in _QUOTED.findall(span)]
    return _clean(quoted[-1]) if quoted else None


def _matches(found: str, want: str, kind: str) -> bool:
    if kind == "number":
        return _same_number(found, want)
    if kind == "list":
        got, exp = found.split(", "), want.split(", ")
        return len(got) == len(exp) and all(map(_same_number, got, exp))
    return _normalise(found) == want
