"""The store sink's writer in a child process, so the store's work never takes the client's GIL.

A writer thread in the client's process (the default `StoreEventSink`) still runs the store's
Python (validation, SQL, projections) under the GIL the event loop needs: measured at
concurrency 32 on a CPU-bound loop, every SQLite call's release and re-take of the GIL costs a
forced switch, and the sink cost 1.4-1.9x the plain client (`bench/llm_bench.py`). Here the
group-commit thread only ships each batch to a child process (`python -m trm_llm.sink_process`)
over a socket pair, one pickled message each way, and waits for the child's answer without the
GIL; the child opens the store as `open_store(url, durability=...)` would, appends the batch in
one transaction and answers with each event's error (None: committed).

- The child runs in the directory and environment the sink was built in (a relative SQLite path
  or `TRM_STORE_URL` means the same store at every start), with the parent's `sys.path` and not
  the current directory's modules (`-P`), in a process group of its own (a terminal's Ctrl-C
  reaches the client, which decides when to stop; the child also ignores SIGINT). The URL,
  which may hold a password, goes over the socket, never on the command line.
- It exits when its socket is shut down: at `close()`, or when the client dies, after the batch
  it is writing. A forked copy of the client cannot use the sink (`EventSinkError`), and its
  copy of the socket keeps nothing alive.
- Each event is pickled alone: one that does not pickle (or that the child cannot unpickle)
  fails alone, as an event the store refuses does.
- A child that dies or does not answer within `ANSWER_TIMEOUT_S` (it is then killed) fails the
  batch it held with `EventSinkError` (those events may or may not be committed: the store's
  transaction is atomic, the answer was lost); a child found dead before a batch is sent is
  replaced first, and a batch never goes to a dead child.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import closing, suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from trm_llm.errors import EventSinkError

if TYPE_CHECKING:
    from trm_store import NewEvent
    from trm_store.backend import Durability

__all__ = ["ChildWriter"]

Event = tuple[str, "NewEvent"]  # (stream id, event)
logger = logging.getLogger("trm_llm.sink")
START_TIMEOUT_S = 120
"""How long a new child may take to import trm_store and open the store before it counts as
failed (a cold import on a loaded machine takes seconds; a PostgreSQL open has its own
connect timeout)."""
ANSWER_TIMEOUT_S = 120
"""How long the child may take over one batch before it is killed and the batch fails: far
beyond a store's own waits (SQLite's busy timeout, PostgreSQL's connect and lock waits), so
only a hung or stopped child reaches it, and `close()` never waits forever."""


@dataclass(frozen=True)
class _Child:
    process: subprocess.Popen[bytes]
    sock: socket.socket  # the client's end: shut down, the child sees EOF whoever holds a copy
    conn: Connection  # framed messages over a dup of `sock`


class ChildWriter:
    """A child process that appends batches to the store at `url`; see the module docstring.

    `write` is called by one thread at a time (the sink's group-commit thread).
    """

    def __init__(self, url: str | None, durability: Durability) -> None:
        self._url = url
        self._durability = durability
        self._cwd = os.getcwd()
        paths = (os.fspath(p) for p in sys.path if isinstance(p, str | os.PathLike))
        self._env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        self._owner = os.getpid()
        self._lock = threading.Lock()  # close() may race a failing write's _stop()
        self._child: _Child | None = self._spawn()

    def write(self, events: Sequence[Event]) -> list[Exception | None]:
        """Append `events` in the child; each event's store error (None: committed)."""
        causes: list[Exception | None] = [None] * len(events)
        frames: dict[int, bytes] = {}
        for i, event in enumerate(events):
            try:
                frames[i] = pickle.dumps(event, pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # e.g. a lock in the data: this event only
                causes[i] = exc
        if not frames:
            return causes
        child = self._ready_child()
        try:
            child.conn.send_bytes(pickle.dumps(list(frames.values()), pickle.HIGHEST_PROTOCOL))
            answers: list[Exception | None] = pickle.loads(_answer_from(child))
        except Exception as exc:
            self._stop()
            message = "the store writer process died; the batch it held may or may not be committed"
            logger.error("%s (%d events): %s", message, len(events), exc)
            raise EventSinkError(message) from exc
        for i, answer in zip(frames, answers, strict=True):
            causes[i] = answer
        return causes

    def close(self) -> None:
        """Shut the socket down; the child finishes its batch, closes its store and exits."""
        self._stop()

    def _ready_child(self) -> _Child:
        """The live child, or a new one if it died while idle (nothing of it is lost)."""
        child = self._child
        if child is not None and (child.process.poll() is not None or child.conn.poll(0)):
            self._stop()  # readable while idle: EOF, it died
            child = None
        if child is None:
            try:
                child = self._child = self._spawn()
            except EventSinkError:
                raise
            except Exception as exc:  # the store's error, typed for the sink's callers
                raise EventSinkError(
                    f"the store writer process could not restart: {type(exc).__name__}: {exc}"
                ) from exc
        return child

    def _spawn(self) -> _Child:
        parent, end = socket.socketpair()
        try:
            process = subprocess.Popen(
                [sys.executable, "-P", "-m", "trm_llm.sink_process", str(end.fileno())],
                pass_fds=(end.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                cwd=self._cwd,
                env=self._env,
                process_group=0,
            )
        except OSError as exc:
            parent.close()
            raise EventSinkError(f"the store writer process could not start: {exc}") from exc
        finally:
            end.close()
        child = _Child(process, parent, Connection(os.dup(parent.fileno())))
        try:
            child.conn.send_bytes(pickle.dumps((self._url, self._durability)))
            if not child.conn.poll(START_TIMEOUT_S):
                raise EventSinkError(
                    f"the store writer process did not open in {START_TIMEOUT_S} s"
                )
            (opened,) = pickle.loads(child.conn.recv_bytes())
        except (EOFError, OSError) as exc:
            opened = EventSinkError("the store writer process exited before opening the store")
            opened.__cause__ = exc
        except BaseException:  # a timeout, a Ctrl-C: no child left behind
            _end(child, kill=True)
            raise
        if opened is not None:  # the store's own error (a bad URL, a schema to upgrade, ...)
            _end(child)
            raise opened
        return child

    def _stop(self) -> None:
        with self._lock:
            child, self._child = self._child, None
        if child is None:
            return
        if os.getpid() != self._owner:  # a forked copy: the child is its parent's, not ours
            child.conn.close()
            child.sock.close()
            return
        _end(child)


def _answer_from(child: _Child) -> bytes:
    """The child's answer to the batch just sent, waited for while it lives, within
    `ANSWER_TIMEOUT_S` (then it is killed)."""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while not child.conn.poll(1.0):
        if child.process.poll() is not None:
            raise EOFError(f"it exited with status {child.process.returncode}")
        if time.monotonic() > deadline:
            child.process.kill()
            raise TimeoutError(f"no answer in {ANSWER_TIMEOUT_S} s: killed")
    return child.conn.recv_bytes()


def _end(child: _Child, *, kill: bool = False) -> None:
    """Shut the socket down (the child sees EOF and exits) and reap the child; kill it if
    asked, or if it does not exit in time."""
    with suppress(OSError):
        child.sock.shutdown(socket.SHUT_RDWR)
    child.conn.close()
    child.sock.close()
    if kill:
        child.process.kill()
    try:
        child.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        child.process.kill()
        child.process.wait()


def _answer(errors: Sequence[Exception | None]) -> bytes:
    """The errors pickled; one that does not survive a pickle round trip (some exceptions
    pickle but do not unpickle) is sent as a `StoreError` naming it."""
    from trm_store import StoreError

    def portable(error: Exception | None) -> Exception | None:
        if error is None:
            return None
        try:
            pickle.loads(pickle.dumps(error, pickle.HIGHEST_PROTOCOL))
        except Exception:
            return StoreError(f"{type(error).__name__}: {error}")
        return error

    return pickle.dumps([portable(e) for e in errors], pickle.HIGHEST_PROTOCOL)


def _events(frames: Sequence[bytes]) -> tuple[list[Any], list[Exception | None]]:
    """The batch's events, and for each frame the error of reading it (None: read)."""
    events: list[Any] = []
    errors: list[Exception | None] = []
    for frame in frames:
        try:
            events.append(pickle.loads(frame))
            errors.append(None)
        except Exception as exc:  # e.g. a class the client defined in its __main__
            errors.append(ValueError(f"the writer process could not read the event: {exc}"))
    return events, errors


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
            events, errors = _events(pickle.loads(conn.recv_bytes()))
            appended = iter(append_events(store, events) if events else [])
            conn.send_bytes(_answer([e if e is not None else next(appended) for e in errors]))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with closing(Connection(int(sys.argv[1]))) as connection:
        serve(connection)
