"""The projections page says how far behind the log's head each projection is: the head and the
rows read in one snapshot. Read apart, an append committed between the two reads made a
projection that follows the log look ahead of the head ("behind" -1: a known race, fixed in the
twenty-second session)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from tests.store.helpers import TOTALS, added
from trm_store import open_store
from trm_store.cli.ui.pages import projections_page


def test_no_projection_is_ahead_of_the_head_an_append_moved_during_the_read(
    store_url: str,
) -> None:
    with (
        open_store(store_url, projections=TOTALS) as store,
        open_store(store_url, projections=TOTALS) as writer,
    ):
        store.append("s", [added(1)])  # the projection follows the log from here
        moved: list[int] = []

        def append_first(_c: Any, _cur: Any, sql: str, *_rest: Any) -> None:
            if "projection_state" in sql and not moved:  # just before the rows are read
                moved.append(writer.append("s", [added(2)])[0].position)

        event.listen(store._backend.engine, "before_cursor_execute", append_first)
        page = projections_page(store)
        assert moved == [2]
        (row,) = page["projections"]
        assert row["checkpoint"] == page["head"]
        assert row["behind"] == 0
