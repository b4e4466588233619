"""Child processes for the concurrent rebuild tests: `python -m tests.store.rebuild_workers MODE
URL ROUNDS`. Every one opens the store with the domain's projections and the test's `Totals`, so
all of them keep the same projections; each exits 1 with the traceback on stderr on any error.
"""

from __future__ import annotations

import os
import sys
import time

from tests.store.helpers import Totals, TotalsV2, added, replayed_totals, totals
from trm_store import Store, open_store, register_projection
from trm_store.connect import create_backend
from trm_store.domain.run_log import RunLog
from trm_store.projections import registered_projections

register_projection(Totals())


def append(url: str, rounds: int) -> None:
    """Append test events and record predictions of one run, in small transactions."""
    with open_store(url) as store, RunLog(store, f"run-{os.getpid()}", config={}) as run:
        for i in range(rounds):
            store.append_batch([(f"s-{i % 7}", [added(i), added(1)], None)])
            run.record_prediction(
                f"q{i}", unit_id="u", prediction="A", correct=True, stop_reason="stop"
            )
            if i % 10 == 0:
                run.flush()


def rebuild(url: str, rounds: int) -> None:
    """Rebuild every projection, again and again."""
    with open_store(url) as store:
        for _ in range(rounds):
            store.rebuild_projections()


def open_and_read(url: str, rounds: int) -> None:
    """Open the store (its recovery) and read a projection, again and again."""
    for _ in range(rounds):
        with open_store(url) as store:
            totals(store)


def verify(url: str, rounds: int) -> None:
    """Verify the projections again and again: each must equal a rebuild from the log."""
    with open_store(url) as store:
        for _ in range(rounds):
            differences = store.verify_projections()
            assert differences == [], differences


def _stop_here(_n: int) -> None:
    """A progress callback: say the first batch is in, then hang until killed."""
    os.write(sys.stdout.fileno(), b"filling\n")
    time.sleep(3600)


def rebuild_then_hang(url: str, version: int) -> None:
    """Start a rebuild (of `Totals` at `version`, the others at theirs), hang in it."""
    if version == 1:
        store = open_store(url)
    else:  # a store of the new version that did not rebuild on opening, as open_store would
        projections = {**registered_projections(), "test_totals": TotalsV2()}
        store = Store(create_backend(url, read_only=False, durability="normal"), projections)
    store.rebuild_projections(progress=_stop_here)


def verify_then_hang(url: str) -> None:
    """Start a verify, hang in it."""
    with open_store(url) as store:
        store.verify_projections(progress=_stop_here)


def check(url: str) -> None:
    """The final state: consistent, every projection ready."""
    with open_store(url) as store:
        assert store.verify_projections() == []
        assert totals(store) == replayed_totals(store)


MODES = {"append": append, "rebuild": rebuild, "open": open_and_read, "verify": verify}

if __name__ == "__main__":
    mode, url, *rest = sys.argv[1:]
    if mode == "rebuild-then-hang":
        rebuild_then_hang(url, int(rest[0]) if rest else 1)
    elif mode == "verify-then-hang":
        verify_then_hang(url)
    else:
        MODES[mode](url, int(rest[0]))
