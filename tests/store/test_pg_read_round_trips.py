"""A read of one statement on a writable PostgreSQL store is one round trip after the pool's
ping: the statement is its own snapshot, so it is sent in autocommit, with no `BEGIN` and no
`COMMIT` (`PostgresBackend.read_statement`; the newest event of a stream took 4 round trips,
2.1-2.6x eventsourcing's time in `bench/read_bench.py`). A read-only store keeps its read-only
transaction, which its guard needs."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.store.helpers import added
from tests.store.round_trip_proxy import round_trip_proxy
from trm_store import Store, open_store

pytestmark = pytest.mark.postgres

READS: dict[str, Callable[[Store], object]] = {
    "newest event": lambda s: s.read_stream("s", backwards=True, limit=1),
    "stream version": lambda s: s.stream_version("s"),
    "head position": lambda s: s.head_position(),
    "a batch of the log": lambda s: list(s.read_all(batch_size=10)),
}
PING = 1
"""The pool's pre-ping at checkout: a connection the server dropped is replaced, not used."""


@pytest.mark.parametrize("read", sorted(READS), ids=str)
def test_a_one_statement_read_is_one_round_trip(pg_url: str, read: str) -> None:
    with round_trip_proxy(pg_url) as (proxy, through), open_store(through) as store:
        store.append("s", [added(1), added(2)])
        READS[read](store)  # warm: the connection opened, statements prepared
        before = proxy.round_trips
        READS[read](store)
        assert proxy.round_trips - before == PING + 1


def test_a_read_only_store_reads_in_its_read_only_transaction(pg_url: str) -> None:
    open_store(pg_url).close()
    with round_trip_proxy(pg_url) as (proxy, through), open_store(through) as writer:
        writer.append("s", [added(1)])
        with open_store(through, read_only=True) as reader:
            reader.read_stream("s", backwards=True, limit=1)
            before = proxy.round_trips
            assert reader.read_stream("s", backwards=True, limit=1)[0].version == 1
            assert proxy.round_trips - before > PING + 1  # BEGIN READ ONLY ... ROLLBACK
