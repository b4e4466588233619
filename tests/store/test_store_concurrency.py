"""Several processes appending at once: no error, dense positions in commit order."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.store.helpers import TOTALS, replayed_totals, totals
from trm_store import open_store

ROOT = Path(__file__).resolve().parents[2]
WORKERS, APPENDS = 4, 500


def _spawn(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.store.workers", *args]
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_four_processes_append_500_each(store_url: str) -> None:
    open_store(store_url, projections=TOTALS).close()
    total = WORKERS * APPENDS
    follower = _spawn("follow", store_url, str(total), "240")
    writers = [_spawn("append", store_url, str(w), str(APPENDS)) for w in range(WORKERS)]
    for writer in writers:
        _out, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err
    seen, err = follower.communicate(timeout=300)
    assert follower.returncode == 0, err

    # A follower that reads by position while writers commit saw every position, in order, once:
    # had a later position become visible before an earlier one, it would have skipped it.
    assert [int(p) for p in seen.split()] == list(range(1, total + 1))

    with open_store(store_url, projections=TOTALS) as store:
        events = list(store.read_all())
        assert [e.position for e in events] == list(range(1, total + 1))
        versions: dict[str, list[int]] = defaultdict(list)
        for event in events:
            versions[event.stream_id].append(event.version)
        assert versions.keys() == {"shared", *(f"w{w}" for w in range(WORKERS))}
        for stream, got in versions.items():
            assert got == list(range(1, len(got) + 1)), stream
        assert len(versions["shared"]) == WORKERS * APPENDS // 2
        assert totals(store) == replayed_totals(store)
        assert store.verify_projections() == []
