"""Group commit's latency (`trm_store.append_queue`): a caller returns as soon as its own
group is committed, whoever writes next."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

from sqlalchemy import Connection, Table

from tests.store.helpers import Totals, added, replayed_totals, totals
from trm_store import RecordedEvent, open_store

LIMIT = 60.0
"""Seconds a thread may take to end."""


SLOW = 0.2
"""Seconds each write of the `Slow` projection's store takes."""


class Slow(Totals):
    """The test projection, taking `SLOW` seconds over each write (as a write of many events,
    or a slow disk, would) and noting when each stream's write got past it."""

    def __init__(self) -> None:
        self.applied: dict[str, float] = {}

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        super().apply(conn, tables, events)
        time.sleep(SLOW)
        now = time.monotonic()
        for e in events:
            self.applied[e.stream_id] = now


def test_a_caller_returns_once_its_group_commits_not_after_the_next_group(store_url: str) -> None:
    """4 threads append 6 times each, and each write takes 0.2 s: every caller returns within
    half a write of its own group's. Before, a group's callers each took a turn lock to learn
    their append was decided, and a thread with a new append could take it first and write its
    group meanwhile: some returned a whole write late (found measuring bench/writers_bench.py's
    10 threads: a committed append's caller returned 7 ms later at the median, up to 78 ms)."""
    projection = Slow()
    with open_store(store_url, projections={"test_totals": projection}) as store:
        late: list[float] = []

        def appender(n: int) -> None:
            for k in range(6):
                stream = f"w{n}-{k}"
                store.append(stream, [added(1)])
                late.append(time.monotonic() - projection.applied[stream])

        threads = [threading.Thread(target=appender, args=(n,), daemon=True) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(LIMIT)
            assert not thread.is_alive()
        assert len(late) == 24
        assert max(late) < SLOW / 2, sorted(late)
        assert totals(store) == replayed_totals(store)
