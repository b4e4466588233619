"""Projections: read models derived from the events only.

A projection declares its tables and how a batch of events changes them. The store applies it
inline, in the append's transaction (`projection_runner`, which also catches it up), or rebuilds it
into scratch tables (`projection_rebuild`): the same `apply` serves live updates, recovery and
verification.

Rules for a projection:
- every table and index name it defines ends with the `suffix` it is given (scratch copies differ
  only by suffix);
- `apply` reads and writes only its own tables, and only through the connection it is handed;
- its state depends on the events alone (no clocks, no randomness): a replay must reproduce it;
- JSON columns use `trm_store.schema.JsonColumn` so live and rebuilt tables can be diffed in SQL.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

from sqlalchemy import Connection, MetaData, Table

from trm_store.errors import StoreError
from trm_store.events import RecordedEvent

__all__ = [
    "Projection",
    "register_projection",
    "registered_projections",
]


class Projection(ABC):
    """A named, versioned read model. Bump `version` whenever tables or `apply` change."""

    name: ClassVar[str]
    version: ClassVar[int]
    event_types: ClassVar[frozenset[str]]

    @abstractmethod
    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        """Define this projection's tables in `metadata`, keyed by logical name."""

    @abstractmethod
    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        """Apply `events` (in position order, all of `event_types`) to `tables`.

        The events are the append's own objects, shared with its caller and every other
        projection: read them, never change them (their data, changed, would reach the read
        models but not the log, which keeps the JSON written before they were applied)."""


_PROJECTIONS: dict[str, Projection] = {}


def register_projection(projection: Projection) -> Projection:
    """Register a projection for every store opened afterwards (re-registering replaces it)."""
    if not isinstance(projection, Projection):
        raise StoreError("register_projection takes a Projection instance")
    if not projection.name or len(projection.name) > 100:
        raise StoreError("a projection name must be 1..100 characters")
    _PROJECTIONS[projection.name] = projection
    return projection


def registered_projections() -> dict[str, Projection]:
    """The registered projections by name, in registration order."""
    return dict(_PROJECTIONS)


def keyed_by_name(projections: Mapping[str, Projection]) -> dict[str, Projection]:
    """`projections` as given, each a Projection under its own name, else StoreError: an
    append moves a checkpoint by its key and a rebuild by its name, so a projection under
    another key would never move."""
    if not isinstance(projections, Mapping):
        kind = type(projections).__name__
        raise StoreError(f"projections: a mapping of name -> Projection, not a {kind}")
    keyed = dict(projections.items())  # read once: what is checked is what is kept
    for key, projection in keyed.items():
        if not isinstance(projection, Projection):
            raise StoreError(f"projections: {key!r} is no Projection ({type(projection).__name__})")
        name = getattr(projection, "name", None)  # a subclass may lack one
        if key != name:
            raise StoreError(f"projections: the key {key!r} is not the projection's name {name!r}")
    return keyed
