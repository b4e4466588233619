"""A projection may use savepoints on the connection it is handed: an upsert that inserts, and on
its own key's refusal rolls back to the savepoint and updates, reads and writes only its own
tables. Appends around it are all written, on both backends.

On PostgreSQL psycopg, once it holds prepared statements of its own (from a statement's fifth
run), answers a `ROLLBACK TO SAVEPOINT` with a `DEALLOCATE ALL` before its next statement, in the
middle of the append's transaction: a statement the store prepared and ran after the projections
would be gone (an attempt to send the rows with the COMMIT as a prepared statement, twenty-second
session, failed this way, and was reverted: bench/README.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, select
from sqlalchemy.exc import IntegrityError

from tests.store.helpers import added
from trm_store import Projection, RecordedEvent, open_store


class SavepointUpsert(Projection):
    """Per stream, how many events: inserted, or on the key's refusal updated, in a savepoint."""

    name = "test_savepoint_upsert"
    version = 1
    event_types = frozenset({"test.added"})

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        return {
            "counts": Table(
                f"test_savepoint_upsert{suffix}",
                metadata,
                Column("stream_id", String(255), primary_key=True),
                Column("n", Integer, nullable=False),
            )
        }

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        counts = tables["counts"]
        for e in events:
            try:
                with conn.begin_nested():
                    conn.execute(counts.insert().values(stream_id=e.stream_id, n=1))
            except IntegrityError:
                conn.execute(
                    counts.update()
                    .where(counts.c.stream_id == e.stream_id)
                    .values(n=counts.c.n + 1)
                )


def test_appends_around_a_projection_that_rolls_back_to_savepoints_are_all_written(
    store_url: str,
) -> None:
    projection = SavepointUpsert()
    with open_store(store_url, projections={projection.name: projection}) as store:
        sizes = [1] * 8 + [2, 3, 4, 2, 70]  # past psycopg's fifth run; a COPY's worth too
        for size in sizes:
            recorded = store.append("same", [added(k) for k in range(size)])
            assert [e.version for e in recorded][-1] == store.stream_version("same")
        assert store.stream_version("same") == sum(sizes)
        with store.query(projection.name) as (conn, tables):
            assert conn.execute(select(tables["counts"].c.n)).scalar_one() == sum(sizes)
        assert store.verify_projections() == []
