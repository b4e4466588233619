"""The store's read models as pandas data frames, one function per table (the `frames` extra).

For analysis in a notebook, as MLflow's `search_runs` and Inspect's log data frames give theirs:

    from trm_store import open_store
    from trm_store import frames

    with open_store("sqlite:///trm.db", read_only=True) as store:
        predictions = frames.predictions(store)
    predictions.groupby("run_id")["correct"].mean()

Rows come from `trm_store.domain.tables` (the same queries `trm export` and the other commands
use). Types are kept: a column whose values are all bools is pandas' nullable `boolean`, all
ints `Int64` and all floats `Float64` (a missing value stays missing, not NaN, and ints do
not turn into floats; a column of ints and floats keeps each value as it is), times
UTC `datetime64`; nested values (a gate's parameters, a call's attempts) stay dicts and
lists. pandas is imported only here, so the store works without it.
"""

from __future__ import annotations

import importlib
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trm_store.domain.tables import table_rows

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = [
    "dual_metrics",
    "frame",
    "gate_blocks",
    "gates",
    "llm_calls",
    "predictions",
    "runs",
]

DataFrame = Any
"""pandas.DataFrame (pandas ships no type information of its own)."""


def _pandas() -> Any:
    try:
        return importlib.import_module("pandas")
    except ImportError as exc:
        raise ImportError(
            "trm_store.frames needs pandas: pip install 'trm[frames]' (or pandas)"
        ) from exc


def _dtype(values: list[Any]) -> str | None:
    """The nullable pandas dtype that keeps a column's values as they are, if one is needed."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(type(v) is bool for v in present):
        return "boolean"
    if all(type(v) is int for v in present):
        return "Int64"
    if all(type(v) is float for v in present):
        return "Float64"
    if all(isinstance(v, datetime) for v in present):
        return "datetime"
    return None


def frame(store: Store, table: str) -> DataFrame:
    """`table` (one of `trm_store.domain.tables.EXPORT_TABLES`) as a data frame."""
    pd = _pandas()
    rows = table_rows(store, table)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    data = {}
    for name in columns:
        values = [row.get(name) for row in rows]
        dtype = _dtype(values)
        if dtype is None:
            data[name] = pd.Series(values, dtype=object)
        elif dtype == "datetime":
            data[name] = pd.to_datetime(pd.Series(values, dtype=object), utc=True)
        else:
            data[name] = pd.Series(values, dtype=dtype)
    return pd.DataFrame(data, columns=columns)


def runs(store: Store) -> DataFrame:
    """Every run: status, reason, start and end, predictions count, holder, lease age."""
    return frame(store, "runs")


def predictions(store: Store) -> DataFrame:
    """Every run's predictions (latest per question), with `run_id`."""
    return frame(store, "predictions")


def dual_metrics(store: Store) -> DataFrame:
    """Every run's dual metrics, in the order they were recorded."""
    return frame(store, "dual_metrics")


def llm_calls(store: Store) -> DataFrame:
    """Every recorded LLM call, in the order they ended."""
    return frame(store, "llm_calls")


def gates(store: Store) -> DataFrame:
    """Every gate: status, verdict, W/L/ties, e-values, parameters."""
    return frame(store, "gates")


def gate_blocks(store: Store) -> DataFrame:
    """Every gate's blocks, with `gate_id`, in order."""
    return frame(store, "gate_blocks")
