"""The store sink's writer in a child process, so the store's work never takes the client's GIL.

A writer thread in the client's process (the default `StoreEventSink`) still runs the store's
Python (validation, SQL, projections) under the GIL the event loop needs: measured at
concurrency 32 on a CPU-bound loop, every SQLite call's release and re-take of the GIL costs a
forced switch, and the sink cost 1.4-1.9x the plain client (`bench/llm_bench.py`). Here the
group-commit thread only ships each batch to a child process (`python -m trm_llm.sink_process`)
over a socket pair, one pickled message each way, and waits for the child's answer without the
GIL; the child opens the store as `open_store(url, durability=...)` would, appends the batch in
one transaction and answers with each event's error (None: committed). On an event loop the
batch is shipped by the loop itself (`awrite`, from `trm_llm.sink_loop`): no thread hand-off at
all, one socket write and one wake-up per batch. One request is on the socket at a time,
whichever path sends it. Messages are length-prefixed frames (`trm_llm.sink_frames`), so both
ends and both paths share one wire format of trm's own.

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
  replaced first (off the loop, on the loop's path), and a batch never goes to a dead child. A
  request interrupted on the loop (the task cancelled while waiting for the answer) leaves the
  socket out of step: that child is shut down, and the next batch starts a new one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import closing, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trm_llm.errors import EventSinkError
from trm_llm.sink_frames import arecv_frame, asend_frame, ready, recv_frame, send_frame

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
_BUSY_WAIT_S = 0.001
"""How often the loop's path looks again for the socket while a thread's request holds it."""


@dataclass
class _Child:
    process: subprocess.Popen[bytes]
    sock: socket.socket  # the client's end, non-blocking: shut down, the child sees EOF
    io: threading.Lock = field(default_factory=threading.Lock)  # one request at a time
    holder: asyncio.AbstractEventLoop | None = None  # the loop whose request holds `io`

    def died_idle(self) -> bool:
        """Whether it died while no request was out: exited, or its socket readable (EOF)."""
        return self.process.poll() is not None or ready(self.sock, select.POLLIN, 0)


class ChildWriter:
    """A child process that appends batches to the store at `url`; see the module docstring.

    `write` (from the sink's group-commit thread) and `awrite` (on an event loop) take turns
    on the socket.
    """

    def __init__(self, url: str | None, durability: Durability) -> None:
        self._url = url
        self._durability = durability
        self._cwd = os.getcwd()
        paths = (os.fspath(p) for p in sys.path if isinstance(p, str | os.PathLike))
        self._env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        self._owner = os.getpid()
        self._lock = threading.Lock()  # close() may race a failing write's _stop()
        self._starting = threading.Lock()  # one start at a time (a thread and a loop's executor)
        self._closed = False
        self._child: _Child | None = self._spawn()

    def write(self, events: Sequence[Event]) -> list[Exception | None]:
        """Append `events` in the child; each event's store error (None: committed)."""
        causes, frames = _framed(events)
        if not frames:
            return causes
        child = self._taken()
        try:
            send_frame(child.sock, pickle.dumps(list(frames.values()), pickle.HIGHEST_PROTOCOL))
            answers: list[Exception | None] = pickle.loads(_answer_from(child))
        except Exception as exc:
            self._stop(only=child)
            raise _lost(len(events), exc) from exc
        finally:
            child.io.release()
        for i, answer in zip(frames, answers, strict=True):
            causes[i] = answer
        return causes

    async def awrite(
        self, events: Sequence[Event], sent: Callable[[], None] = lambda: None
    ) -> list[Exception | None]:
        """`write` on an event loop, without blocking it: the socket is written and read by the
        loop; a child that must be started again is started by a thread of its executor.
        `sent()` is called once the whole request is on the socket: cancelled before it, the
        child got none of the batch or part of its frame, and writes none of it."""
        if os.getpid() != self._owner:  # a forked copy: the child and its socket are not ours
            raise EventSinkError(f"the store writer belongs to process {self._owner}")
        causes, frames = _framed(events)
        if not frames:
            return causes
        loop = asyncio.get_running_loop()
        child = await self._ataken(loop)
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                payload = pickle.dumps(list(frames.values()), pickle.HIGHEST_PROTOCOL)
                sending = loop.create_task(asend_frame(child.sock, payload))
                try:
                    await asyncio.shield(sending)
                finally:
                    if sending.done() and not sending.cancelled() and not sending.exception():
                        sent()
                    else:  # cut short: the socket is shut now, before the send goes on
                        sending.cancel()
                        _shut(child)
                answers: list[Exception | None] = pickle.loads(await arecv_frame(child.sock))
        except BaseException as exc:
            # Out of step (cancelled mid-request) or dead: shut down, the child reaped by a
            # thread (it waits for the child to finish its batch), never on the loop.
            self._stop(wait=False, kill=isinstance(exc, TimeoutError), only=child)
            if not isinstance(exc, Exception):
                raise
            raise _lost(len(events), exc) from exc
        finally:
            child.holder = None
            child.io.release()
        for i, answer in zip(frames, answers, strict=True):
            causes[i] = answer
        return causes

    def close(self) -> None:
        """Shut the socket down; the child finishes its batch, closes its store and exits. No
        child is started after this: a batch still to write fails with `EventSinkError`."""
        self._closed = True
        self._stop()

    def _taken(self) -> _Child:
        """The current child, its socket taken for one request (for the writer thread). Held
        by a loop that stopped mid-request (it will never answer for it), that child is shut
        down and a new one started; a closed writer refuses at once."""
        while True:
            child = self._current()
            if child.io.acquire(timeout=_BUSY_WAIT_S * 50):
                if self._usable(child):
                    return child
                continue
            holder = child.holder
            if holder is not None and not holder.is_running():
                self._stop(wait=False, only=child)

    async def _ataken(self, loop: asyncio.AbstractEventLoop) -> _Child:
        """`_taken` on a loop: a start in the executor, the socket waited for by polling."""
        while True:
            child = self._child
            if child is None:
                child = await loop.run_in_executor(None, self._current)
            if child.io.acquire(blocking=False):
                if self._usable(child):
                    child.holder = loop
                    return child
                continue
            await asyncio.sleep(_BUSY_WAIT_S)

    def _usable(self, child: _Child) -> bool:
        """With `child.io` held: whether it is still the current child and alive. If not, `io`
        is released, and one that died (readable while no request is out: EOF) is shut down
        (reaped by a thread: this may run on a loop)."""
        if child is not self._child:
            child.io.release()
            return False
        if child.died_idle():
            child.io.release()
            self._stop(wait=False, only=child)
            return False
        return True

    def _current(self) -> _Child:
        """The current child, or a new one if there is none (nothing of a dead one is lost)."""
        if self._closed:
            raise EventSinkError("the store sink is closed: nothing more can be written")
        with self._starting:
            child = self._child
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
        parent.setblocking(False)  # for the loop's path; the thread's waits in `poll`
        child = _Child(process, parent)
        try:
            send_frame(parent, pickle.dumps((self._url, self._durability)))
            try:
                (opened,) = pickle.loads(recv_frame(parent, START_TIMEOUT_S))
            except TimeoutError:
                raise EventSinkError(
                    f"the store writer process did not open in {START_TIMEOUT_S} s"
                ) from None
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

    def _stop(self, *, wait: bool = True, kill: bool = False, only: _Child | None = None) -> None:
        """Shut the child down (`wait`: until it has exited, else a thread reaps it); with
        `only`, only if that one is still the current child."""
        with self._lock:
            if only is not None and self._child is not only:
                return
            child, self._child = self._child, None
        if child is None:
            return
        if os.getpid() != self._owner:  # a forked copy: the child is its parent's, not ours
            child.sock.close()
            return
        if wait:
            _end(child, kill=kill)
        else:
            _shut(child)  # now: whatever still runs on the loop cannot send to it any more
            threading.Thread(target=_end, args=(child,), kwargs={"kill": kill}).start()


def _framed(events: Sequence[Event]) -> tuple[list[Exception | None], dict[int, bytes]]:
    """Each event pickled alone (by index), and the error of each that does not pickle (e.g. a
    lock in its data: that event only)."""
    causes: list[Exception | None] = [None] * len(events)
    frames: dict[int, bytes] = {}
    for i, event in enumerate(events):
        try:
            frames[i] = pickle.dumps(event, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            causes[i] = exc
    return causes, frames


def _lost(size: int, cause: BaseException) -> EventSinkError:
    message = "the store writer process died; the batch it held may or may not be committed"
    logger.error("%s (%d events): %s: %s", message, size, type(cause).__name__, cause)
    return EventSinkError(message)


def _answer_from(child: _Child) -> bytes:
    """The child's answer to the batch just sent, waited for while it lives, within
    `ANSWER_TIMEOUT_S` (then it is killed)."""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while not ready(child.sock, select.POLLIN, 1.0):
        if child.process.poll() is not None:
            raise EOFError(f"it exited with status {child.process.returncode}")
        if time.monotonic() > deadline:
            child.process.kill()
            raise TimeoutError(f"no answer in {ANSWER_TIMEOUT_S} s: killed")
    return recv_frame(child.sock)


def _shut(child: _Child) -> None:
    """Shut the socket down: the child reads what was sent, then EOF."""
    with suppress(OSError):
        child.sock.shutdown(socket.SHUT_RDWR)


def _end(child: _Child, *, kill: bool = False) -> None:
    """Shut the socket down (the child sees EOF and exits) and reap the child; kill it if
    asked, or if it does not exit in time."""
    _shut(child)
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


def serve(sock: socket.socket) -> None:
    """The child: open the store the first message names, then append each batch received."""
    from trm_llm.sink import append_events
    from trm_store import open_store

    url, durability = pickle.loads(recv_frame(sock))
    try:
        store = open_store(url, durability=durability)
    except Exception as exc:
        send_frame(sock, _answer([exc]))
        return
    with closing(store), suppress(EOFError, OSError):  # the parent closed the socket, or died
        send_frame(sock, _answer([None]))
        while True:
            events, errors = _events(pickle.loads(recv_frame(sock)))
            appended = iter(append_events(store, events) if events else [])
            send_frame(sock, _answer([e if e is not None else next(appended) for e in errors]))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with socket.socket(fileno=int(sys.argv[1])) as end:
        serve(end)
