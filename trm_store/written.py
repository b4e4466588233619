"""An append as written: where its events landed, and the recorded events built from that when
someone asks for them (its caller, or a projection that takes them).

Group commit (`trm_store.append_queue`) has one thread write the appends of many: had it built
every append's `RecordedEvent`s too, a group of ten 100-event appends made it build 1,000
objects at once while the other callers waited, holding their own. Each such burst set off a
young collection of the garbage collector, which promoted the waiting appends' objects, and
every few groups a full collection followed (~45 ms over a process of ~120,000 objects: one
round in three of `bench/writers_bench.py`'s 10 threads). Built by each caller once its append
is decided, the events come and go with the caller's own objects (bench/README, "Twenty-fourth
session").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import count, repeat

from trm_store.events import RecordedEvent, recorded_event
from trm_store.prepared import PreparedAppend

__all__ = ["Written"]


@dataclass(slots=True, eq=False)
class Written:
    """`prepared` as written at `at`: the position and stream version of each item's first
    event (an item's events are numbered one after another in both, by the SQLite writer and by
    PostgreSQL's numbering statement alike)."""

    prepared: Sequence[PreparedAppend]
    starts: Sequence[tuple[int, int]]
    at: datetime
    built: list[RecordedEvent] | None = None

    @classmethod
    def found(cls, events: list[RecordedEvent]) -> Written:
        """An append whose events are built already (a retry's, read back from the log)."""
        return cls((), (), events[0].recorded_at, events)

    def events(self) -> list[RecordedEvent]:
        """The recorded events, in position order: built at the first call, the same list
        after (a projection that took them and the caller see the same objects)."""
        built = self.built
        if built is None and len(self.prepared) == 1 and len(self.prepared[0].event_ids) == 1:
            # One event (most appends): its fields read one by one, no loop to set up.
            (item,), ((position, version),) = self.prepared, self.starts
            built = self.built = [
                recorded_event(
                    position,
                    item.event_ids[0],
                    item.stream_id,
                    version,
                    item.types[0],
                    item.schema_versions[0],
                    item.datas[0],
                    item.metas[0],
                    self.at,
                )
            ]
        elif built is None:
            at = self.at
            built = []  # set once whole: an interrupt part way leaves it unbuilt, not short
            for item, (position, version) in zip(self.prepared, self.starts, strict=True):
                # Each item's events numbered on from its first, their fields zipped by `map`
                # (timeit, 50 events: 234 against 244 ns an event for a Python loop).
                built += map(
                    recorded_event,
                    count(position),
                    item.event_ids,
                    repeat(item.stream_id),
                    count(version),
                    item.types,
                    item.schema_versions,
                    item.datas,
                    item.metas,
                    repeat(at),
                )
            self.built = built
        return built
