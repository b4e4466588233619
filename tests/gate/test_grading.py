"""The short-answer grader on replies as small real models write them (issue 17 point 2).

The corpus holds the formats SmolLM-class models produce for the demo's nine task kinds: the
asked-for `ANSWER:` line, markdown, "the answer is", bare numbers and words, number words
("three times"), a final number after some working, lists; and replies with no answer at all,
which must stay unreadable (INFRA `parse_error`), never a wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trm_gate import Graded, Grader, ShortAnswerGrader, number_in

CORPUS: list[tuple[str, str, bool | None]] = [
    # the asked-for format, and what models make of it
    ("Let me work this out.\nANSWER: 12", "12", True),
    ("ANSWER: 12", "12", True),
    ("answer: 12", "12", True),
    ("**ANSWER:** 12", "12", True),
    ("**Answer: 12**", "12", True),
    ("Final answer: 12", "12", True),
    ("ANSWER: 13", "12", False),
    ("ANSWER: 12 apples", "12", True),
    ("First 5 + 7 = 12.\nANSWER: 12", "12", True),
    # bare answers
    ("12", "12", True),
    ("12.", "12", True),
    ("**12**", "12", True),
    (" 12\n", "12", True),
    ("The answer is 12.", "12", True),
    ("The answer is: 12", "12", True),
    ("So the result is 1,234.", "1234", True),
    # number words
    ("three times", "3", True),
    ("The letter 'a' appears three times in 'kalo'.", "3", True),
    ("It appears twice.", "2", True),
    ("once", "1", True),
    ("There are twenty-one.", "21", True),
    ("ANSWER: four", "4", True),
    ("five", "3", False),
    # the last number after some working
    ("To add 25 and 17, we add the units: 5 + 7 = 12, carry 1, so 25 + 17 = 42", "42", True),
    ("12 - 5 = 7", "7", True),
    ("The digits are 4, 5 and 6. Their sum is 15", "15", True),
    ("Multiplying 6 by 7 we get 42, I think.", "42", True),
    ("The largest number is 93.", "93", True),
    ("The word has 2 vowels.", "3", False),
    # lists
    ("ANSWER: 1, 5, 9", "1, 5, 9", True),
    ("ANSWER: 1,5,9", "1, 5, 9", True),
    ("Sorted: [1, 5, 9]", "1, 5, 9", True),
    ("The numbers 9, 1, 5 sorted are 1, 5, 9.", "1, 5, 9", True),
    ("ANSWER: 1, 9, 5", "1, 5, 9", False),
    ("1, 5", "1, 5, 9", False),
    # words
    ("ANSWER: olak", "olak", True),
    ("ANSWER: 'olak'", "olak", True),
    ("olak", "olak", True),
    ("Olak.", "olak", True),
    ("The reversed word is olak.", "olak", True),
    ("Reversing 'kalo' gives **olak**.", "olak", True),
    ("Reversed, 'kalo' becomes \"olka\".", "olak", False),
    ("ANSWER: olka", "olak", False),
    # nothing to read: INFRA parse_error, never a wrong answer
    ("Hmm, this one is tricky; I would rather not commit to a single answer here.", "12", None),
    ("", "12", None),
    ("I cannot help with that request, sorry about it, really I cannot.", "olak", None),
    ("Sorting numbers is a common task in computer science.", "1, 5, 9", None),
]


@dataclass(frozen=True)
class _Q:
    answer: str


@pytest.mark.parametrize(("reply", "expected", "correct"), CORPUS)
def test_grades_realistic_replies(reply: str, expected: str, correct: bool | None) -> None:
    graded = ShortAnswerGrader().grade(_Q(expected), reply)
    assert graded.correct is correct, graded
    assert (graded.prediction is None) == (correct is None)


def test_corpus_is_varied() -> None:
    assert len(CORPUS) >= 30
    assert {c for _, _, c in CORPUS} == {True, False, None}


def test_is_a_grader_with_a_version() -> None:
    grader: Grader[_Q] = ShortAnswerGrader()
    assert grader.version.startswith("short-answer-")
    assert ShortAnswerGrader().grade(_Q("3"), "three times") == Graded("3", True)


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(["", "ANSWER: ", "**", "= "]))
def test_any_number_is_read_back(n: int, prefix: str) -> None:
    reply = f"{prefix}{n}{'**' if prefix == '**' else ''}"
    assert ShortAnswerGrader().grade(_Q(str(n)), reply) == Graded(str(n), True)
    assert ShortAnswerGrader().grade(_Q(str(n + 1)), reply).correct is False


@given(st.integers(min_value=0, max_value=99))
def test_number_words(n: int) -> None:
    ones = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    teens = "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen"
    tens = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
    if n < 10:
        word = ones[n]
    elif n < 20:
        word = teens.split()[n - 10]
    else:
        word = tens[n // 10 - 2] + ("" if n % 10 == 0 else "-" + ones[n % 10])
    assert number_in(f"It is {word}.") == str(n)
