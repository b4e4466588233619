"""A stream id is an id by the shared rule (`trm_store.vocabulary.id_problem`), control characters
allowed and kept verbatim, and holds nothing a backend cannot store (NUL, lone surrogates)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.store.helpers import added
from trm_store.errors import EventValidationError
from trm_store.prepare import AppendPreparer
from trm_store.vocabulary import ID_MAX, id_problem

PREPARE = AppendPreparer({"host": "h"})


def _accepted(stream_id: object) -> bool:
    try:
        PREPARE((stream_id, [added(1)], None))  # type: ignore[arg-type]
    except EventValidationError:
        return False
    return True


@given(
    st.one_of(
        st.text(max_size=20),
        st.text(min_size=ID_MAX - 2, max_size=ID_MAX + 2),
        st.sampled_from(["", " ", "\t\n", "a\tb", "a\x00", "\ud800x", "é", 7, None, b"s"]),
    )
)
def test_the_stream_id_rule_is_the_id_rule_without_printability_plus_storable(
    stream_id: object,
) -> None:
    storable = isinstance(stream_id, str) and "\x00" not in stream_id
    storable = storable and not any("\ud800" <= c <= "\udfff" for c in str(stream_id))
    expected = id_problem(stream_id, printable=False) is None and storable
    assert _accepted(stream_id) is expected


@pytest.mark.parametrize(
    ("stream_id", "message"), [(" ", "non-blank"), ("a\x00", "contains a NUL")]
)
def test_a_refused_stream_id_says_why(stream_id: str, message: str) -> None:
    with pytest.raises(EventValidationError, match=message):
        PREPARE((stream_id, [added(1)], None))
