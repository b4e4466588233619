"""`Written`: an append as written, its recorded events built by whoever asks first: its caller,
or the group's writer for a projection that takes them. Both backends."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import astuple
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import trm_store.written
from tests.store.helpers import assert_log_is_whole, log_of, noted, run_and_compare
from trm_store import NewEvent, RecordedEvent, Store
from trm_store.append_args import AppendItem
from trm_store.append_queue import QueuedAppend
from trm_store.prepare import AppendPreparer
from trm_store.written import Written


def test_an_interrupt_part_way_through_the_build_leaves_the_events_unbuilt_not_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal handler's exception raised while the events are built: the next call builds
    them all, where a list filled in place would have been returned short."""
    prepared = AppendPreparer({"host": "h", "pid": 1})(("s", [noted(n) for n in range(3)], None))
    written = Written([prepared], [(7, 1)], datetime.now(UTC))
    build = trm_store.written.recorded_event
    calls = 0

    def interrupted_at_the_second(*fields: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt
        return build(*fields)

    monkeypatch.setattr(trm_store.written, "recorded_event", interrupted_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        written.events()
    events = written.events()
    assert [(e.position, e.version) for e in events] == [(7, 1), (8, 2), (9, 3)]
    assert written.events() is events


@given(counts=st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_each_recorded_event_holds_its_own_columns_and_numbers(counts: list[int]) -> None:
    """Whatever the shape (one event, the fast path, or several items of several), each event
    is built from its own place in its item's columns, numbered on from the item's start."""
    preparer = AppendPreparer({"host": "h", "pid": 1})
    prepared = [
        preparer((f"s{k}", [noted(n) for n in range(c)], None)) for k, c in enumerate(counts)
    ]
    starts = [(10 * k + 1, k + 2) for k in range(len(counts))]
    at = datetime.now(UTC)
    expected = [
        (
            position + j,
            p.event_id,
            item.stream_id,
            version + j,
            p.type,
            p.schema_version,
            p.data,
            p.meta,
            at,
        )
        for item, (position, version) in zip(prepared, starts, strict=True)
        for j, p in enumerate(item.events())
    ]
    events = Written(prepared, starts, at).events()
    assert [astuple(e) for e in events] == expected
    assert all(type(e) is RecordedEvent for e in events)


def _batch(kind: str, shape: Sequence[tuple[str, int]], base: int) -> list[AppendItem]:
    """An append batch of `kind` events, `shape` giving each item's stream and event count."""
    return [
        (stream, [NewEvent(kind, {"amount": base + k}) for k in range(count)], None)
        for stream, count in shape
    ]


_SHAPES = [[("a", 2), ("b", 1), ("a", 1)], [("b", 2)], [("c", 1), ("a", 3)]]
"""Batches that share streams, and name one stream twice: each item's events are numbered one
after another, in position and in version, whoever numbers them."""


@pytest.mark.parametrize("kind", ["test.added", "test.noted"])
def test_a_group_s_writer_builds_the_events_only_for_the_projections_that_take_them(
    store: Store, kind: str
) -> None:
    """The writer of a group numbers every append of it; the `RecordedEvent`s of one that no
    projection takes are built by its own caller, after (`trm_store.written`). Whoever builds
    them, each append gets exactly the log's events."""
    group = [
        QueuedAppend([store._prepare(item) for item in _batch(kind, shape, 10 * n)])
        for n, shape in enumerate(_SHAPES)
    ]
    store._appends._write_group(group)
    assert [q.error for q in group] == [None] * len(group)
    written = [q.written for q in group]
    assert all(w is not None and (w.built is not None) == (kind == "test.added") for w in written)
    returned = [e for w in written if w is not None for e in w.events()]
    assert returned == log_of(store)
    assert [w.events() is w.events() for w in written if w is not None] == [True] * len(group)
    assert_log_is_whole(store)


@pytest.mark.parametrize("kind", ["test.added", "test.noted"])
def test_threads_appending_batches_with_drawn_ids_each_get_the_log_s_events(
    store: Store, kind: str
) -> None:
    """4 threads append batches (a stream named twice in one) with ids trm draws, the appends
    PostgreSQL numbers itself when no projection takes them: each caller's events are the
    log's, field for field, however they were grouped."""
    returned: list[list[RecordedEvent]] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        for n in range(20):
            shape = [(f"{k}-{stream}", count) for stream, count in _SHAPES[n % len(_SHAPES)]]
            recorded = store.append_batch(_batch(kind, shape, n))
            with lock:
                returned.append(recorded)

    log = run_and_compare(store, worker, 4, returned)
    assert len(log) == 4 * sum(sum(c for _, c in _SHAPES[n % len(_SHAPES)]) for n in range(20))
