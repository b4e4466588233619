"""The log's JSON text: canonical (sorted keys, no spaces, ASCII), only for JSON values, and read
back as json.loads reads it."""

from __future__ import annotations

import json
import subprocess
import sys
from json.encoder import c_make_encoder  # type: ignore[attr-defined]
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from trm_store import json_codec
from trm_store.errors import EventValidationError
from trm_store.json_codec import choose_encoder, dumps_json, dumps_json_all, loads_json

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


ANY_TEXT = st.text(st.characters(codec=None) | st.sampled_from(["\x00", "\ud800", "\udc00"]))
"""Text with what the log refuses: NUL, lone surrogates, a pair written as two characters."""
ANY_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT | st.just(b"bytes"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=10,
)
"""JSON values and what dumps_json refuses: NaN, infinities, bytes, refused text."""


def _dumped(dump: Any) -> Any:
    try:
        return dump()
    except EventValidationError as e:
        return type(e)


@given(st.lists(ANY_VALUES, max_size=6))
@example([1, {"a": "NUL \x00"}])
@example(["lone \ud800", 2])
@example([{"pair as two": "\ud83d\ude00"}])
def test_dumps_json_all_writes_and_refuses_what_dumps_json_does_one_by_one(
    values: list[Any],
) -> None:
    """The append's path (`dumps_json_all`, the C encoder mapped over its data) against a
    `dumps_json` each: the same texts, or an EventValidationError when any value is refused."""
    each = [_dumped(lambda v=value: dumps_json(v, what="data")) for value in values]
    refused = EventValidationError in each
    assert _dumped(lambda: dumps_json_all(values, what="data")) == (
        EventValidationError if refused else each
    )


def _keys_sorted(value: Any) -> Any:
    """`value` with every dict built in sorted key order."""
    if isinstance(value, dict):
        return {key: _keys_sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_keys_sorted(item) for item in value]
    return value


@given(st.lists(ANY_VALUES.map(_keys_sorted), max_size=6))
@example([{"a": {"c": None, "d": []}, "b": 1}])
def test_values_whose_keys_are_in_order_are_written_the_same_without_the_sort(
    values: list[Any],
) -> None:
    """`keys_sorted=True` (a plain model's normal forms) skips the encoder's sort: the same
    texts, and the same refusals."""
    assert _dumped(lambda: dumps_json_all(values, what="data", keys_sorted=True)) == _dumped(
        lambda: dumps_json_all(values, what="data")
    )


def test_an_unsorted_c_encoder_that_writes_other_text_is_not_used() -> None:
    assert json_codec._chunks_in_order is not None  # this Python's, probed at import
    assert json_codec._unsorted_chunks(_spaced, json_codec._encode) is None
    assert json_codec._unsorted_chunks(_new_arguments, json_codec._encode) is None


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


SURROGATE_PAIR = st.tuples(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDBFF),
    st.characters(min_codepoint=0xDC00, max_codepoint=0xDFFF),
).map("".join)
"""Two code points that UTF-16 would read as one character past U+FFFF: not valid Unicode in a
Python str, and written by the JSON encoder exactly as that character is."""
ANY_TEXT = st.lists(
    st.characters(exclude_characters="\x00") | SURROGATE_PAIR | st.just("\U0001f600"), max_size=6
).map("".join)
"""Text with surrogates alone and in pairs, and characters past U+FFFF, among the rest."""


def _valid_unicode(value: Any) -> bool:
    """The oracle: strict UTF-8 refuses every surrogate code point, paired or not."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@given(
    st.recursive(
        st.none() | st.integers() | ANY_TEXT,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
        max_leaves=8,
    )
)
def test_text_reads_back_as_it_was_written_or_is_refused(value: Any) -> None:
    """A surrogate code point anywhere, alone or two making a pair, is refused (a pair used to be
    written, and read back as the one character it encodes: another string); valid text reads
    back equal, characters past U+FFFF included."""
    try:
        text = dumps_json(value, what="value")
    except EventValidationError as e:
        assert "surrogate" in str(e)
        assert not _valid_unicode(value)
    else:
        assert _valid_unicode(value)
        assert loads_json(text) == value


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


# -- the C encoder's probe ---------------------------------------------------------------------

PUBLIC = json_codec._CANONICAL.encode


def _spaced(*args: Any) -> Any:
    """c_make_encoder with another item separator: a different text."""
    markers, default, encoder, indent, key_separator, _item, *rest = args
    return c_make_encoder(markers, default, encoder, indent, key_separator, ", ", *rest)


def _allowing_nan(*args: Any) -> Any:
    """c_make_encoder that writes NaN: the same texts, but it refuses less."""
    return c_make_encoder(*args[:-1], True)


def _new_arguments(*args: Any) -> Any:
    raise TypeError("c_make_encoder() takes exactly 10 arguments (9 given)")


@pytest.mark.parametrize("make_encoder", [None, _spaced, _allowing_nan, _new_arguments])
def test_a_c_encoder_that_differs_from_the_public_one_is_not_used(make_encoder: Any) -> None:
    assert choose_encoder(make_encoder) == PUBLIC


def test_the_c_encoder_is_used_when_it_agrees() -> None:
    chosen = choose_encoder(c_make_encoder)
    assert chosen != PUBLIC
    value = {"b": [1, 2.5, None, "é"], "a": True}
    assert chosen(value) == PUBLIC(value) == '{"a":true,"b":[1,2.5,null,"\\u00e9"]}'


def test_the_import_time_probe_falls_back_to_the_public_encoder() -> None:
    """A Python whose c_make_encoder writes other text: the codec imports on the public encoder
    and writes the same canonical text."""
    program = (
        "import json, json.encoder\n"
        "real = json.encoder.c_make_encoder\n"
        "json.encoder.c_make_encoder = lambda *a: real(*a[:5], ', ', *a[6:])\n"
        "from trm_store import json_codec\n"
        "assert json_codec._encode == json_codec._CANONICAL.encode, 'the probe did not fall back'\n"
        "value = {'b': [1, 2], 'a': None}\n"
        "public = json.dumps(value, sort_keys=True, separators=(',', ':'), allow_nan=False)\n"
        "assert json_codec.dumps_json(value, what='x') == public\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
