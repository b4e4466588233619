"""The log's JSON text: canonical (sorted keys, no spaces, ASCII), only for JSON values, and read
back as json.loads reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trm_store.errors import EventValidationError
from trm_store.json_codec import dumps_json, loads_json

STORABLE_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
"""Valid Unicode without NUL: what every backend can store."""
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | STORABLE_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(STORABLE_TEXT, inner, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_dumps_json_writes_what_json_dumps_writes_canonically(value: Any) -> None:
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    assert dumps_json(value, what="value") == expected


def _cyclic() -> list[Any]:
    cycle: list[Any] = []
    cycle.append(cycle)
    return cycle


@pytest.mark.parametrize(
    "value",
    [float("nan"), [float("-inf")], {"s": {1}}, {(1, 2): 3}, b"bytes", _cyclic()],
    ids=["nan", "infinity", "set", "tuple-key", "bytes", "cycle"],
)
def test_values_without_json_text_are_refused_with_a_typed_error(value: Any) -> None:
    with pytest.raises(EventValidationError, match="value is not JSON"):
        dumps_json(value, what="value")


@given(JSON_VALUES)
def test_loads_json_reads_back_what_dumps_json_wrote(value: Any) -> None:
    text = dumps_json(value, what="value")
    assert loads_json(text) == json.loads(text)


@given(st.text(max_size=30) | JSON_VALUES.map(lambda v: f" {json.dumps(v, indent=1)}\n"))
def test_loads_json_reads_any_text_as_json_loads_does(text: str) -> None:
    try:
        expected = json.loads(text)
    except json.JSONDecodeError as error:
        with pytest.raises(json.JSONDecodeError) as raised:
            loads_json(text)
        assert str(raised.value) == str(error)
        return
    assert json.dumps(loads_json(text)) == json.dumps(expected)  # as text: NaN != NaN
