"""The ranges both backends hold, defined once in `trm_store.vocabulary`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trm_store.vocabulary import INT64_MAX, INT64_MIN, count_problem, text_problem


@given(st.integers())
def test_count_problem_accepts_exactly_the_range(value: int) -> None:
    assert (count_problem(value, INT64_MIN) is None) == (INT64_MIN <= value <= INT64_MAX)


def test_count_problem_refuses_bools_floats_and_strings() -> None:
    for value in (True, 1.0, "1", None):
        assert count_problem(value) is not None


@given(st.text())
def test_text_problem_accepts_text_postgresql_and_sqlite_keep(value: str) -> None:
    stored_verbatim = "\x00" not in value
    assert (text_problem(value) is None) == stored_verbatim


def test_text_problem_names_the_lone_surrogate_and_the_nul() -> None:
    assert "surrogate" in (text_problem("a\udcff") or "")
    assert "NUL" in (text_problem("a\x00") or "")
    assert text_problem(b"bytes") is not None
