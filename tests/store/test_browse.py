"""The web view's paginated queries against the plain reading of the same projection: any
filter, sort and page of `predictions_page` is the matching slice of `read_predictions`, and
`run_totals` counts what it holds, on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trm_store import DomainInputError, RunLog, open_store
from trm_store.domain.browse import PREDICTION_SORTS, final_metrics, predictions_page, run_totals
from trm_store.domain.runs import read_predictions
from trm_store.store import Store

OUTCOMES = [
    (True, "stop"),
    (False, "stop"),
    (False, "length"),
    (None, "error"),
    (None, "parse_error"),
]


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """Every registered projection (tests/store's own `store` has a test projection only)."""
    with open_store(store_url) as opened:
        yield opened


@pytest.fixture
def run(store: Store) -> str:
    with RunLog(store, "r") as log:
        for i in range(37):
            correct, reason = OUTCOMES[(i * 7) % len(OUTCOMES)]
            log.record_prediction(
                f"q{(i * 13) % 37:02d}",
                unit_id=f"u{i % 5}",
                prediction=i,
                correct=correct,
                stop_reason=reason,
            )
    return "r"


def _key(row: dict[str, Any], sort: str) -> Any:
    value = row[sort]
    return (value is not None, value)  # a missing verdict first, as the query sorts it


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    unit=st.none() | st.sampled_from(["u0", "u3", "nope"]),
    correct=st.none() | st.booleans(),
    reason=st.none() | st.sampled_from(["stop", "length", "error"]),
    sort=st.sampled_from(PREDICTION_SORTS),
    descending=st.booleans(),
    offset=st.integers(0, 40),
    limit=st.integers(1, 20),
)
def test_a_page_is_the_matching_slice(
    store: Store,
    run: str,
    unit: str | None,
    correct: bool | None,
    reason: str | None,
    sort: str,
    descending: bool,
    offset: int,
    limit: int,
) -> None:
    everything = read_predictions(store, run)
    seq = {row["question_id"]: n for n, row in enumerate(everything)}
    matching = [
        row
        for row in everything
        if (unit is None or row["unit_id"] == unit)
        and (correct is None or row["correct"] is correct)
        and (reason is None or row["stop_reason"] == reason)
    ]
    if sort != "seq":  # stable sorts: the key, then first-seen order
        matching.sort(key=lambda row: seq[row["question_id"]])
        matching.sort(key=lambda row: _key(row, sort), reverse=descending)
    elif descending:
        matching.reverse()
    page = predictions_page(
        store,
        run,
        unit_id=unit,
        correct=correct,
        stop_reason=reason,
        sort=sort,  # type: ignore[arg-type]
        descending=descending,
        offset=offset,
        limit=limit,
    )
    assert page["total"] == len(matching)
    assert page["rows"] == matching[offset : offset + limit]


def test_totals_count_the_run(store: Store, run: str) -> None:
    rows = read_predictions(store, run)
    totals = run_totals(store, run)
    judged = [r for r in rows if r["correct"] is not None]
    assert totals["predictions"] == len(rows) == 37
    assert totals["judged"] == len(judged)
    assert totals["correct"] == sum(r["correct"] for r in judged)
    assert totals["infra"] == len(rows) - len(judged)


@pytest.mark.parametrize(
    "bad",
    [
        {"limit": 501},
        {"limit": 0},
        {"offset": -1},
        {"sort": "nope"},
        {"stop_reason": "banana"},
        # SQLite compared them as numbers (1 matched True, "x" nothing), PostgreSQL refused
        # them with a generic driver error: refused alike, before any query.
        {"correct": 1},
        {"correct": "x"},
        {"descending": "no"},
    ],
)
def test_bad_page_arguments_are_typed_errors(store: Store, run: str, bad: dict[str, Any]) -> None:
    with pytest.raises(DomainInputError):
        predictions_page(store, run, **bad)


def test_final_metrics_take_a_list_of_run_ids_not_a_string(store: Store, run: str) -> None:
    with pytest.raises(DomainInputError, match="sequence of run ids"):
        final_metrics(store, run)  # type: ignore[arg-type]  # its characters were run ids
