"""The store sink's writer in a child process, so the store's work never takes the client's GIL.

A writer thread in the client's process (the default `StoreEventSink`) still runs the store's
Python (validation, SQL, projections) under the GIL the event loop needs: measured at
concurrency 32 on a CPU-bound loop, every SQLite call's release and re-take of the GIL costs a
forced switch, and the sink cost 1.4-1.9x the plain client (`bench/llm_bench.py`). Here the
group-commit thread only ships each batch to a child process (`python -m trm_llm.sink_process`)
over a socket pair, one pickled message each way, and waits for the child's answer without the
GIL; the child opens the store as `open_store(url, durability=...)` would, appends the batch in
one transaction and answers with each event's error (None: committed).

- The URL (it may hold a password) goes over the socket, never on the command line.
- The child ignores SIGINT (a Ctrl-C reaches the whole process group: the parent decides when
  to stop) and exits when its socket closes: at `close()`, or when the parent dies, so it never
  outlives the client by more than the batch it is writing.
- A child that dies fails the batch it held with `EventSinkError` (those events may or may not
  be committed: the store's transaction is atomic, the answer was lost); the next batch starts
  a new child.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from contextlib import closing, suppress
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Literal

from trm_llm.errors import EventSinkError

if TYPE_CHECKING:
    from trm_store import NewEvent

__all__ = ["ChildWriter", "Durability"]

Durability = Literal["normal", "full"]
Event = tuple[str, "NewEvent"]  # (stream id, event)
logger = logging.getLogger("trm_llm.sink")
START_TIMEOUT_S = 120
"""How long a new child may take to import trm_store and open the store before it counts as
failed (a cold import on a loaded machine takes seconds; a PostgreSQL open has its own
connect timeout)."""


class ChildWriter:
    """A child process that appends batches to the store at `url`; see the module docstring.

    Used by one thread at a time (the sink's group-commit thread, then `close`).
    """

    def __init__(self, url: str | None, durability: Durability) -> None:
        self._url = url
        self._durability = durability
        self._conn: Connection | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._start()

    def write(self, events: Sequence[Event]) -> list[Exception | None]:
        """Append `events` in the child; each event's store error (None: committed)."""
        if self._conn is None:
            self._start()
        assert self._conn is not None
        try:
            self._conn.send_bytes(pickle.dumps(list(events), pickle.HIGHEST_PROTOCOL))
            errors: list[Exception | None] = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            self._stop()
            message = "the store writer process died; the batch it held may or may not be committed"
            logger.error("%s (%d events)", message, len(events))
            raise EventSinkError(message) from exc
        return errors

    def close(self) -> None:
        """Close the socket; the child finishes, closes its store and exits."""
        self._stop()

    def _start(self) -> None:
        parent, child = socket.socketpair()
        with parent, child:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            try:
                process = subprocess.Popen(
                    [sys.executable, "-m", "trm_llm.sink_process", str(child.fileno())],
                    pass_fds=(child.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    env=env,
                )
            except OSError as exc:
                raise EventSinkError(f"the store writer process could not start: {exc}") from exc
            conn = Connection(os.dup(parent.fileno()))
        try:
            conn.send_bytes(pickle.dumps((self._url, self._durability)))
            if not conn.poll(START_TIMEOUT_S):
                raise EventSinkError(
                    f"the store writer process did not start in {START_TIMEOUT_S} s"
                )
            (opened,) = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError) as exc:
            opened = EventSinkError("the store writer process exited before opening the store")
            opened.__cause__ = exc
        except EventSinkError as exc:
            opened = exc
        if opened is not None:  # the store's own error (a bad URL, a schema to upgrade, ...)
            conn.close()
            _reap(process)
            raise opened
        self._conn, self._process = conn, process

    def _stop(self) -> None:
        conn, process = self._conn, self._process
        self._conn = self._process = None
        if conn is not None:
            conn.close()
        if process is not None:
            _reap(process)


def _reap(process: subprocess.Popen[bytes]) -> None:
    """Wait for a child whose socket is closed; kill it if it does not exit in time."""
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _answer(errors: Sequence[Exception | None]) -> bytes:
    """The errors pickled; one that does not pickle is sent as a `StoreError` naming it."""
    try:
        return pickle.dumps(list(errors), pickle.HIGHEST_PROTOCOL)
    except Exception:
        from trm_store import StoreError

        plain = [None if e is None else StoreError(f"{type(e).__name__}: {e}") for e in errors]
        return pickle.dumps(plain, pickle.HIGHEST_PROTOCOL)


def serve(conn: Connection) -> None:
    """The child: open the store the first message names, then append each batch received."""
    from trm_llm.sink import append_events
    from trm_store import open_store

    url, durability = pickle.loads(conn.recv_bytes())
    try:
        store = open_store(url, durability=durability)
    except Exception as exc:
        conn.send_bytes(_answer([exc]))
        return
    with closing(store), suppress(EOFError, OSError):  # the parent closed the socket, or died
        conn.send_bytes(_answer([None]))
        while True:
            batch: Any = pickle.loads(conn.recv_bytes())
            conn.send_bytes(_answer(append_events(store, batch)))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with closing(Connection(int(sys.argv[1]))) as connection:
        serve(connection)
