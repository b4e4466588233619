"""Property: any interleaving of appends (conflicting ones included) and rebuilds leaves every
projection equal to a replay of the log from scratch."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import _pg_schema_url
from tests.store.helpers import TOTALS, added, replayed_totals, totals
from trm_store import ConcurrencyError, Store, open_store

append_op = st.tuples(
    st.just("append"),
    st.integers(0, 3),  # stream
    st.lists(st.integers(-5, 5), min_size=1, max_size=4),  # amounts
    st.one_of(st.none(), st.integers(0, 6)),  # expected_version: often wrong on purpose
)
operations = st.lists(
    st.one_of(append_op, st.just(("rebuild",)), st.just(("reopen",)), st.just(("retry",))),
    max_size=25,
)


def _run(url: str, ops: list[tuple[object, ...]]) -> None:
    store: Store = open_store(url, projections=TOTALS)
    last_batch: tuple[str, list[object]] | None = None
    try:
        for op in ops:
            if op[0] == "append":
                _, stream, amounts, expected = op
                events = [added(a, event_id=str(uuid.uuid4())) for a in amounts]  # type: ignore[union-attr]
                before = store.head_position()
                try:
                    store.append(f"s{stream}", events, expected_version=expected)  # type: ignore[arg-type]
                    last_batch = (f"s{stream}", events)
                except ConcurrencyError:
                    assert store.head_position() == before
            elif op[0] == "retry" and last_batch is not None:
                before = store.head_position()
                store.append(last_batch[0], last_batch[1])  # type: ignore[arg-type]
                assert store.head_position() == before
            elif op[0] == "rebuild":
                store.rebuild_projections()
            elif op[0] == "reopen":
                store.close()
                store = open_store(url, projections=TOTALS)
            assert totals(store) == replayed_totals(store)
        assert store.verify_projections() == []
    finally:
        store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_projections_equal_a_replay_on_sqlite(ops: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _run(f"sqlite:///{Path(tmp) / 'p.db'}", ops)


@pytest.mark.postgres
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_projections_equal_a_replay_on_postgresql(ops: list[tuple[object, ...]]) -> None:
    for url in _pg_schema_url():
        _run(url, ops)
