"""Processes opening a new SQLite store together all get it: the switch to WAL waits.

Several processes opening a new file at once (a job's workers) each switch it to WAL, and SQLite
refused one of the switches at once with "database is locked", without its busy handler: one of
every 40-60 groups of four opens in a bench's worker pool, and in this test within its first
2 to 13 new files, in five runs (`trm_store.sqlite._use_wal` now tries again, up to the busy
timeout).
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from tests.store.helpers import TOTALS, added
from trm_store import open_store


def _open_and_append(url: str) -> int:
    with open_store(url, projections=TOTALS) as store:
        return len(store.append("s", [added(1)]))


def test_processes_opening_a_new_file_together_all_get_the_store(tmp_path: Path) -> None:
    with ProcessPoolExecutor(4, mp_context=get_context("spawn")) as pool:
        list(pool.map(_open_and_append, [f"sqlite:///{tmp_path / 'warm.db'}"] * 4))
        for k in range(25):
            url = f"sqlite:///{tmp_path / f'trm-{k}.db'}"
            assert list(pool.map(_open_and_append, [url] * 4)) == [1] * 4
            with open_store(url, projections=TOTALS) as store:
                assert store.stream_version("s") == 4
