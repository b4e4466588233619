"""An event id names one event (issue 14 point 3).

A retry of the very same append (same streams, types, data and meta, compared as the JSON the log
holds) is answered with the recorded events and writes nothing; any other use of a recorded id,
through `append`, `append_batch` or `append_prepared`, raises EventIdConflictError naming the id
and where it lives, and writes nothing; an id used twice in one append is refused as such.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict
from sqlalchemy import event

from tests.store.helpers import added, die_in_a_child
from trm_store import (
    EventIdConflictError,
    EventValidationError,
    NewEvent,
    RecordedEvent,
    Store,
    StoreError,
    register_event_type,
)
from trm_store.json_codec import dumps_json


class Anything(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: object


register_event_type("test.reuse", Anything)
register_event_type("test.reuse.other", Anything)

Items = list[tuple[str, list[NewEvent], int | None]]

texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4)
"""Text every backend stores (no NUL, no lone surrogate), as values and as keys."""
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        texts,
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
TWINS: tuple[tuple[Any, Any], ...] = (
    (1, 1.0),
    (1, True),
    (0, False),
    (0.0, -0.0),
    (0, 0.0),
    (10**16, 1e16),
    ([1, {"a": 0}], [1.0, {"a": False}]),
)
"""Values Python says are equal (==) whose JSON differs: the log would hold other data."""
CHANGES = ("same", "stream", "type", "data", "twin", "meta", "fewer", "more")


def _text(value: Any) -> str:
    return dumps_json(value, what="test value")


def _exact(events: Sequence[RecordedEvent]) -> list[tuple[Any, ...]]:
    """Events as the log holds them: JSON compared as text, so 1 and 1.0 differ."""
    return [
        (e.position, e.event_id, e.stream_id, e.version, e.type, _text(e.data), _text(e.meta))
        for e in events
    ]


def _event(value: Any, meta: dict[str, Any] | None = None) -> NewEvent:
    return NewEvent("test.reuse", {"value": value}, meta=meta, event_id=str(uuid.uuid4()))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[str, Items, Items, str]:
    """(how, an append, the append again with `change` made to one of its events, change).

    `how` appends with `append` or `append_prepared` (one stream) or `append_batch` (1-3
    streams); each stream gets 1-3 events, each with its own id.
    """
    how = draw(st.sampled_from(["append", "batch", "prepared"]))
    original: Items = [
        (
            f"s{s}",
            [
                _event(
                    draw(json_values), draw(st.none() | st.dictionaries(st.just("a"), json_values))
                )
                for _ in range(draw(st.integers(1, 3)))
            ],
            draw(st.sampled_from([None, 0])),
        )
        for s in range(draw(st.integers(1, 3)) if how == "batch" else 1)
    ]
    sizes = [len(events) for _, events, _ in original]
    change = draw(
        st.sampled_from(CHANGES if sum(sizes) > 1 else tuple(c for c in CHANGES if c != "fewer"))
    )
    i = draw(st.integers(0, len(original) - 1))
    j = draw(st.integers(0, sizes[i] - 1))
    stream, events, expected = original[i]
    old = events[j]
    if change == "twin":  # the original holds one of the pair, the change the other
        a, b = draw(st.sampled_from(TWINS))
        before, after = draw(st.sampled_from([(a, b), (b, a)]))
        assert before == after and _text(before) != _text(after)
        old = dataclasses.replace(old, data={"value": before})
        events = [*events[:j], old, *events[j + 1 :]]
        original = [*original[:i], (stream, events, expected), *original[i + 1 :]]
    changed: list[NewEvent] = list(events)
    moved: Items = []
    if change == "stream":
        del changed[j]
        moved = [("elsewhere", [old], None)]
    elif change == "type":
        changed[j] = dataclasses.replace(old, type="test.reuse.other")
    elif change == "data":
        value = draw(json_values.filter(lambda v: _text(v) != _text(old.data["value"])))
        changed[j] = dataclasses.replace(old, data={"value": value})
    elif change == "twin":
        changed[j] = dataclasses.replace(old, data={"value": after})
    elif change == "meta":
        changed[j] = dataclasses.replace(old, meta={**(old.meta or {}), "z": draw(json_values)})
    elif change == "fewer":  # resends part of a recorded append: still recorded events
        del changed[j]
    elif change == "more":  # resends it with an event the log does not hold
        changed.insert(j, _event(draw(json_values)))
    again = [*original[:i], (stream, changed, expected), *original[i + 1 :], *moved]
    again = [item for item in again if item[1]]
    if how != "batch":  # one stream per append: the changed one (or where it moved)
        again = again[-1:]
    return how, original, again, change


def _append(store: Store, how: str, ns: str, items: Items) -> list[RecordedEvent]:
    """Append `items` (streams prefixed with `ns`) the way `how` names."""
    named = [(ns + stream, events, expected) for stream, events, expected in items]
    if how == "batch":
        return store.append_batch(named)
    recorded = []
    for stream, events, expected in named:
        if how == "append":
            recorded += store.append(stream, events, expected_version=expected)
        else:  # prepared: validated (and ids fixed) first, as RunLog does
            prepared = [store.prepare(e) for e in events]
            recorded += store.append_prepared(stream, prepared, expected_version=expected)
    return recorded


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios())
def test_a_retry_is_answered_from_the_log_and_any_other_use_of_an_id_is_refused(
    store: Store, scenario: tuple[str, Items, Items, str]
) -> None:
    how, original, again, change = scenario
    ns = uuid.uuid4().hex[:8] + "-"
    first = _append(store, how, ns, original)
    log = _exact(list(store.read_all()))
    if change in ("same", "fewer"):  # every event resent is one the log holds: a retry
        recorded = {e.event_id: e for e in first}
        resent = [recorded[e.event_id] for _, events, _ in again for e in events]
        assert _exact(_append(store, how, ns, again)) == _exact(resent)
    else:
        with pytest.raises(EventIdConflictError) as refused:
            _append(store, how, ns, again)
        error = refused.value
        stored = {e.event_id: e for e in first}[error.event_id]
        assert (error.stream_id, error.version) == (stored.stream_id, stored.version)
        assert error.event_id in str(error) and repr(stored.stream_id) in str(error)
    assert _exact(list(store.read_all())) == log  # nothing written either way


@pytest.mark.parametrize("how", ["append", "batch", "prepared"])
def test_an_id_used_twice_in_one_append_is_refused_as_such(store: Store, how: str) -> None:
    twice = str(uuid.uuid4())
    items: Items = [
        ("a", [added(1, event_id=twice), added(2)], None),
        ("b" if how == "batch" else "a", [added(3, event_id=twice)], None),
    ]
    if how != "batch":
        items = [("a", items[0][1] + items[1][1], None)]
    with pytest.raises(EventValidationError, match=f"event_id {twice} appears twice"):
        _append(store, how, "", items)
    assert store.head_position() == 0


def test_an_id_used_twice_is_refused_as_such_even_when_the_stream_moved(store: Store) -> None:
    store.append("a", [added(1)])
    twice = str(uuid.uuid4())
    with pytest.raises(EventValidationError, match="appears twice"):
        store.append("a", [added(1, event_id=twice)] * 2, expected_version=0)
    assert store.head_position() == 1


def test_a_retry_with_a_stale_expected_version_is_answered_from_the_log(store: Store) -> None:
    """RunLog's flush retried after a commit whose answer was lost: the stream moved since."""
    events = [store.prepare(added(n)) for n in range(3)]
    first = store.append_prepared("r", events, expected_version=0)
    store.append("r", [added(9)])
    assert store.append_prepared("r", events, expected_version=0) == first
    assert store.head_position() == 4


def test_a_retry_from_another_process_is_the_same_event(store_url: str, store: Store) -> None:
    """The origin (host, pid) in the meta says where an event was written from: a process that
    retries what another one recorded (ids it derives, not draws) resends the same event."""
    event_id = str(uuid.uuid4())
    body = (
        "from tests.store.helpers import added\n"
        f"store.append(sys.argv[2], [added(5, meta={{'job': 1}}, event_id={event_id!r})])\n"
    )
    die_in_a_child(store_url, "s", body)
    (recorded,) = store.append("s", [added(5, meta={"job": 1}, event_id=event_id)])
    assert recorded.position == 1 and recorded.meta["job"] == 1
    with pytest.raises(EventIdConflictError, match="other meta"):
        store.append("s", [added(5, meta={"job": 2}, event_id=event_id)])
    assert store.head_position() == 1


def test_the_id_check_adds_no_statement_to_a_successful_append(store: Store) -> None:
    """The conflict is found from the unique index's refusal, never looked for in advance."""
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, sql: str, *_rest: Any) -> None:
        # PostgreSQL sends the stream id and the projections' epoch into the statement that
        # reads the heads.
        heads = r"trm_append_heads\('[^']*', *-?\d+\)"
        sent.append(re.sub(heads, "trm_append_heads(<stream>, <epoch>)", sql))

    engine = store._backend.engine
    store.append("warm", [added(0)])  # a writer connection prepares once (PostgreSQL)
    event.listen(engine, "before_cursor_execute", seen)
    try:
        store.append("a", [added(1), added(2)])
        without_ids, sent[:] = list(sent), []
        store.append("b", [added(1, event_id=str(uuid.uuid4())), added(2)])
        store.append_prepared("c", [store.prepare(added(1)), store.prepare(added(2))])
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert sent == without_ids * 2


def test_the_conflict_error_is_a_store_error_and_public() -> None:
    import trm_store

    assert trm_store.EventIdConflictError is EventIdConflictError
    assert issubclass(EventIdConflictError, StoreError)
