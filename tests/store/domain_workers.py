"""Child processes the domain crash tests SIGKILL: `python -m tests.store.domain_workers MODE ...`.

Each prints one line per durable step, so the parent can kill it right after a known point.
"""

from __future__ import annotations

import itertools
import sys

from trm_store import open_store
from trm_store.domain.manifest_file import export_manifest
from trm_store.domain.run_log import RunLog


def export_forever(url: str, path: str, *workspaces: str) -> None:
    """Export the workspaces' manifests to the same file in turn, forever."""
    with open_store(url) as store:
        for i in itertools.count():
            export_manifest(store, workspaces[i % len(workspaces)], path)
            print(i, flush=True)


def predict_forever(url: str, run_id: str, batch_size: str) -> None:
    """Record predictions forever; print the count each time a batch has been flushed."""
    size = int(batch_size)
    with (
        open_store(url) as store,
        RunLog(store, run_id, batch_size=size, flush_interval_s=None) as log,
    ):  # whole batches only: what the crash test checks
        for i in itertools.count():
            log.record_prediction(
                f"q{i:07d}", unit_id=f"u{i // 5}", prediction="A", correct=True, stop_reason="stop"
            )
            if (i + 1) % size == 0:
                print(i + 1, flush=True)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "export":
        export_forever(*args)
    elif mode == "predict":
        predict_forever(*args)
    else:
        raise SystemExit(f"unknown mode {mode}")
