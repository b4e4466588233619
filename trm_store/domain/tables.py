"""The store's read models as flat tables, one row a dict, for export and data frames.

Each table is read through the domain's own query functions (`list_runs`, `read_predictions`,
`read_dual_metric`, `llm_calls`, `list_gates`, `gate_blocks`), so `trm export`, `trm_store.frames`
and the other commands can never disagree about what a row holds. Values keep their types: a
prediction's `correct` is a bool or None, times are aware UTC datetimes, nested values (a gate's
parameters, a call's attempts) stay dicts and lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trm_store.domain.errors import DomainInputError
from trm_store.domain.gates import gate_blocks, list_gates
from trm_store.domain.llm_calls.queries import llm_calls
from trm_store.domain.metrics import read_dual_metric
from trm_store.domain.run_list import list_runs
from trm_store.domain.runs import read_predictions

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["EXPORT_TABLES", "table_rows"]

Row = dict[str, Any]


def _runs(store: Store) -> Iterator[Row]:
    yield from (dict(run) for run in list_runs(store, now=datetime.now(UTC)))


def _run_ids(store: Store) -> list[str]:
    return [run["run_id"] for run in list_runs(store, now=datetime.now(UTC))]


def _predictions(store: Store) -> Iterator[Row]:
    for run_id in _run_ids(store):
        for prediction in read_predictions(store, run_id):
            yield {"run_id": run_id, **prediction}


def _dual_metrics(store: Store) -> Iterator[Row]:
    for run_id in _run_ids(store):
        yield from read_dual_metric(store, run_id=run_id)


def _llm_calls(store: Store) -> Iterator[Row]:
    yield from llm_calls(store)


def _gates(store: Store) -> Iterator[Row]:
    yield from list_gates(store)


def _gate_blocks(store: Store) -> Iterator[Row]:
    for gate in list_gates(store):
        for block in gate_blocks(store, gate["gate_id"]):
            yield {"gate_id": gate["gate_id"], **block}


EXPORT_TABLES: dict[str, Callable[[Store], Iterator[Row]]] = {
    "runs": _runs,
    "predictions": _predictions,
    "dual_metrics": _dual_metrics,
    "llm_calls": _llm_calls,
    "gates": _gates,
    "gate_blocks": _gate_blocks,
}
"""Every exportable table by name, in the order `trm export --help` lists them."""


def table_rows(store: Store, table: str) -> list[Row]:
    """Every row of `table` (a key of EXPORT_TABLES), in the order its query gives them."""
    reader = EXPORT_TABLES.get(table)
    if reader is None:
        raise DomainInputError(f"unknown table {table!r:.80}; known: {', '.join(EXPORT_TABLES)}")
    return list(reader(store))
