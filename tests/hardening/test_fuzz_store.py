"""Fuzzing the event store with hostile payloads and stream ids, on SQLite and PostgreSQL.

The event type under test takes `data: Any`, so whatever is generated gets past the model and
reaches the JSON layer. Properties: only `StoreError`s escape; an append that fails writes nothing
(the head does not move, the other event of the same append is not there either); an append that
succeeds reads back exactly, types included, what `EventType.validate` made of the data; a stream
id is stored and read back verbatim, never spliced into SQL.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict
from sqlalchemy import create_engine, inspect

from trm_store import NewEvent, Store, StoreError, open_store, register_event_type
from trm_store.event_types import event_type

TYPE = "hardening.fuzz_any"
HOSTILE_IDS = [
    "'; DROP TABLE events; --",
    '"; DROP TABLE events; --',
    "run:1' OR '1'='1",
    "events); DELETE FROM events; --",
    "%(stream_id)s",
    ":stream_id",
    "?",
    "\\x00",
    "a\x00b",
    "\x00",
    " ",
    "\t\n\r",
    "",
    "x" * 255,
    "x" * 256,
    "ü" * 255,
    "😀" * 255,
    "\u202e\u200b\ufeff",
    "\ud800",
    "$$; DROP TABLE events; $$",
]


class AnyData(BaseModel):
    """Permissive on purpose: the payload reaches the JSON layer unchanged."""

    model_config = ConfigDict(extra="forbid")
    data: Any


@pytest.fixture(autouse=True)
def _registered() -> None:
    register_event_type(TYPE, AnyData)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """One store per backend for the whole property; examples share it (heads are relative)."""
    with open_store(store_url) as opened:
        yield opened
    engine = create_engine(store_url)
    try:  # nothing a stream id or payload said was run as SQL
        assert {"events"} <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _same(a: Any, b: Any) -> bool:
    """Deep equality that also compares types (1e16 and 10**16 are not the same JSON value)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


class Payload(dict[Any, Any]):
    """Event data whose repr survives ints too long to print (hypothesis prints failures)."""

    def __repr__(self) -> str:
        try:
            text = dict.__repr__(self)
        except ValueError:
            return "Payload(<holds an int of more than 4300 digits>)"
        return f"Payload({text if len(text) < 2000 else text[:2000] + '...'})"


def _nest(depth: int) -> Any:
    value: Any = "bottom"
    for n in range(depth):
        value = [value] if n % 2 else {"k": value}
    return value


_BIG_INTS = [2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, -(10**400)]
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(_BIG_INTS),
    st.integers(4290, 4310).map(lambda digits: -(10**digits)),  # around int->str's limit
    st.floats(),  # NaN and infinities included
    st.sampled_from([1e16, 1e300, 1.5e308, 5e-324, -0.0, 1e-7]),
    st.text(max_size=12),  # NUL and other control characters included
    st.binary(max_size=6),
)
_keys = st.one_of(
    st.text(max_size=6),
    st.integers(),
    st.booleans(),
    st.none(),
    st.floats(),
    st.tuples(st.integers()),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(_keys, inner, max_size=4),
        st.tuples(inner, inner),
        st.frozensets(st.integers() | st.text(max_size=4), max_size=3),
        st.sets(st.integers(), max_size=3),
    ),
    max_leaves=16,
)
_payloads = st.one_of(
    _values.map(lambda v: {"data": v}),
    st.integers(1, 600).map(lambda d: {"data": _nest(d)}),
    st.dictionaries(_keys, _values, max_size=3),  # extra keys, non-string keys, no `data`
).map(Payload)


def _append_or_error(store: Store, stream_id: str, events: list[NewEvent]) -> StoreError | None:
    """Append; a StoreError is returned (anything else propagates and fails the test)."""
    try:
        store.append(stream_id, events)
    except StoreError as exc:
        return exc
    return None


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(payload=Payload({"data": 1e300}))
@example(payload=Payload({"data": 1e16}))
@example(payload=Payload({"data": b"\xff"}))
@example(payload=Payload({"data": _nest(400)}))
@example(payload=Payload({"data": 10**5000}))
@example(payload=Payload({"data": 2**64}))
@example(payload=Payload({"data": "a\x00b"}))
@example(payload=Payload({"data": float("nan")}))
@given(payload=_payloads)
def test_payload_is_refused_whole_or_read_back_exactly(store: Store, payload: Any) -> None:
    """A typed error and nothing written, or the validated data back with its types."""
    stream_id = f"fuzz-{uuid.uuid4().hex}"
    head = store.head_position()
    events = [NewEvent(TYPE, {"data": "before"}), NewEvent(TYPE, payload)]
    error = _append_or_error(store, stream_id, events)
    if error is not None:
        assert store.head_position() == head, f"{error!r} after a partial write"
        assert store.read_stream(stream_id) == []
        return
    expected = event_type(TYPE).validate(payload)
    recorded = store.read_stream(stream_id)
    assert [e.version for e in recorded] == [1, 2]
    assert store.head_position() == head + 2
    assert _same(recorded[1].data, expected), f"stored {recorded[1].data!r}, sent {expected!r}"


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    stream_id=st.one_of(
        st.sampled_from(HOSTILE_IDS),
        st.text(max_size=40),
        st.text(min_size=250, max_size=260),
        st.text(st.characters(codec="utf-8"), max_size=8).map(lambda s: s + "\x00"),
    )
)
def test_stream_ids_are_stored_verbatim_or_refused_whole(store: Store, stream_id: str) -> None:
    """Hostile ids come back byte for byte or are refused; a refused batch writes nothing."""
    marker = f"fuzz-{uuid.uuid4().hex}"
    head = store.head_position()
    try:
        store.append_batch(
            [
                (marker, [NewEvent(TYPE, {"data": stream_id})], None),
                (stream_id, [NewEvent(TYPE, {"data": stream_id})], None),
            ]
        )
    except StoreError:
        assert store.head_position() == head
        assert store.read_stream(marker) == []
        assert not (stream_id.strip() and len(stream_id) <= 255 and _storable(stream_id)), (
            f"a valid stream id {stream_id!r} was refused"
        )
        return
    assert stream_id.strip() and len(stream_id) <= 255 and _storable(stream_id), stream_id
    recorded = store.read_stream(stream_id)
    assert recorded[-1].stream_id == stream_id
    assert recorded[-1].data == {"data": stream_id}
    assert [e.stream_id for e in store.read_all(after_position=head)] == [marker, stream_id]


def _storable(text: str) -> bool:
    """Text both backends can hold: valid Unicode without NUL (PostgreSQL text has no NUL)."""
    return "\x00" not in text and not any("\ud800" <= c <= "\udfff" for c in text)
