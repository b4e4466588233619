"""Child processes for the store tests: `python -m tests.store.workers MODE URL ...`."""

from __future__ import annotations

import os
import sys
import time

from tests.store.helpers import TOTALS, added
from trm_store import open_store


def append_many(url: str, worker: int, count: int) -> None:
    """Append `count` events, alternating between an own stream and a shared one."""
    with open_store(url, projections=TOTALS) as store:
        for i in range(count):
            stream = "shared" if i % 2 else f"w{worker}"
            store.append(stream, [added(i)])


def follow(url: str, total: int, seconds: float) -> None:
    """Follow the log by position while others write; print every position seen, in order."""
    with open_store(url, read_only=True, projections={}) as store:
        last, deadline = 0, time.monotonic() + seconds
        while last < total and time.monotonic() < deadline:
            for event in store.read_all(after_position=last, batch_size=50):
                print(event.position, flush=True)
                last = event.position


def subscribe(url: str, total: int, seconds: float, prefix: str) -> None:
    """Follow the log with `subscribe` (read-only, only streams starting with `prefix`) until
    `total` events came; print "ready", then every position seen, in order."""
    with open_store(url, read_only=True, projections={}) as store:
        deadline = time.monotonic() + seconds
        with store.subscribe(stream_prefix=prefix or None) as subscription:
            print("ready", flush=True)
            for seen, event in enumerate(subscription, 1):
                print(event.position, event.stream_id, flush=True)
                if seen == total or time.monotonic() > deadline:
                    break


def append_until_killed(url: str, rebuild_every: int) -> None:
    """Append forever, printing each acknowledged (position, event_id); rebuild now and then."""
    with open_store(url, projections=TOTALS) as store:
        i = 0
        while True:
            i += 1
            events = store.append(f"s-{i % 5}", [added(i), added(1)])
            # One write(2) per acknowledgement (< PIPE_BUF, so atomic): a kill can never leave
            # half a line that print's buffered pieces could produce.
            for event in events:
                os.write(sys.stdout.fileno(), f"{event.position} {event.event_id}\n".encode())
            if i % rebuild_every == 0:
                store.rebuild_projections()


if __name__ == "__main__":
    mode, url, *rest = sys.argv[1:]
    if mode == "append":
        append_many(url, int(rest[0]), int(rest[1]))
    elif mode == "follow":
        follow(url, int(rest[0]), float(rest[1]))
    elif mode == "subscribe":
        subscribe(url, int(rest[0]), float(rest[1]), rest[2] if len(rest) > 2 else "")
    elif mode == "crash":
        append_until_killed(url, int(rest[0]))
    elif mode in ("cli", "cli-gc-probe"):  # the real `trm` CLI, the test projection registered
        from tests.store.helpers import GcProbe, Totals
        from trm_store import register_projection
        from trm_store.cli import main

        register_projection(Totals() if mode == "cli" else GcProbe(report=True))
        raise SystemExit(main([url, *rest]))
    else:
        raise SystemExit(f"unknown mode {mode}")
