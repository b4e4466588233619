"""`RunLog`: the context manager a harness writes a run through.

Entering registers the run (`run.registered`, with a lease); predictions are buffered and written
`batch_size` at a time, one transaction per batch, and also once the oldest buffered one has
waited `flush_interval_s` (2 s by default; a background thread of the RunLog writes it, so
`trm runs` and other readers see a live run's predictions within seconds even when it records
slowly). A killed process loses at most what it had not flushed: nothing that `flush()` (or
leaving the block) acknowledged. Leaving appends `run.completed`, or `run.failed` with the error
when the block raised. `register_run=False` is for reading a run someone else wrote (a
baseline): it appends
nothing, on enter or exit, and works on a store opened `read_only=True`.

A run's life has one direction: registered, written to, ended once. Registration expects a new
stream, so a run id registered before (finished, or running in this or another process: a nested
`RunLog` of the same id) is refused with RunStateError; a new attempt is a new run id. Every
later append expects the version this writer last wrote, so once the run was ended by someone else
(`mark_stale_runs`, `fail_run`), its flushes, heartbeats and its end raise RunStateError and
nothing more is written to it.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from trm_store.domain._common import check_fields, check_id, check_int, validated
from trm_store.domain.errors import DomainInputError, RunStateError
from trm_store.domain.run_leases import release_lease, write_lease
from trm_store.domain.runs import (
    COMPLETED,
    ERROR_MAX,
    FAILED,
    PREDICTION_KEYS,
    PREDICTION_RECORDED,
    REGISTERED,
    Registered,
    read_predictions,
    run_info,
    run_version,
    stream_of,
)
from trm_store.errors import ConcurrencyError, EventValidationError
from trm_store.events import NewEvent
from trm_store.prepared import PreparedEvent
from trm_store.vocabulary import outcome_problem

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_FLUSH_INTERVAL_S", "HEARTBEAT_INTERVAL", "RunLog"]

_log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 200
DEFAULT_FLUSH_INTERVAL_S = 2.0
"""A buffered prediction is written at most this long after it was recorded (None: by count)."""
HEARTBEAT_INTERVAL = timedelta(seconds=5)
"""Flushes refresh the lease at most this often; call `heartbeat()` during long silent work."""

Clock = Callable[[], datetime]


def _utc_now() -> datetime:
    return datetime.now(UTC)


class RunLog:
    """Write (or, with register_run=False, only read) one run. Use it as a context manager."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        *,
        register_run: bool = True,
        config: dict[str, Any] | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        clock: Clock | None = None,
        flush_interval_s: float | None = DEFAULT_FLUSH_INTERVAL_S,
    ) -> None:
        self.run_id = check_id("run_id", run_id)
        if not isinstance(register_run, bool):
            raise DomainInputError(f"register_run must be a bool, got {register_run!r}")
        if config is not None and not register_run:
            raise DomainInputError("config is recorded on registration: it needs register_run=True")
        self._store = store
        self._register = register_run
        self._config = config
        self._batch_size = check_int("batch_size", batch_size, minimum=1)
        self._clock = clock or _utc_now
        if flush_interval_s is not None and (
            isinstance(flush_interval_s, bool)
            or not isinstance(flush_interval_s, int | float)
            or not 0 < flush_interval_s < math.inf
        ):
            raise DomainInputError(
                f"flush_interval_s must be a positive number or None, got {flush_interval_s!r}"
            )
        self._interval = flush_interval_s
        self._lock = threading.Lock()  # the buffer and the version, shared with the flusher
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._oldest = 0.0  # time.monotonic() of the oldest buffered prediction
        self._host, self._pid = socket.gethostname(), os.getpid()
        self._pending: list[PreparedEvent] = []
        self._pending_shown = False
        """Whether a write of the buffer failed: it may have handed the events to the
        projections, which may have changed their data in place, so writing them again checks
        each one."""
        self._last_heartbeat: datetime | None = None
        self._state: Literal["new", "open", "closed"] = "new"
        self._version = 0
        """The run's stream version as this writer last wrote it."""

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> RunLog:
        if self._state != "new":
            raise RunStateError(f"RunLog({self.run_id!r}) can be entered once")
        if not self._register:
            run_info(self._store, self.run_id)  # UnknownRunError for a run never registered
        else:
            now = self._clock()
            data = {"started_at": now, "config": self._config, "host": self._host, "pid": self._pid}
            event = validated(Registered, data, f"RunLog({self.run_id!r}) registration")
            try:
                self._append([self._store.prepare(NewEvent(REGISTERED, event.model_dump()))], 0)
            except RunStateError:
                status = run_info(self._store, self.run_id)["status"]
                raise RunStateError(
                    f"run {self.run_id!r} is registered already ({status}): a run is registered "
                    "once, so a new attempt needs a new run id"
                ) from None
            self._beat(now)
        self._state = "open"
        return self

    def _start_flusher(self) -> None:
        """Under the lock, with something buffered: make sure a flusher thread is on its way (it
        lives only while the buffer is not empty, so an idle or abandoned RunLog holds none)."""
        if self._interval is None or self._flusher is not None:
            return
        self._flusher = threading.Thread(
            target=self._flush_by_time, name=f"RunLog({self.run_id}) flusher", daemon=True
        )
        self._flusher.start()

    def _flush_by_time(self) -> None:
        """The flusher thread: write the buffer once its oldest prediction is `_interval` old,
        then end when nothing is left. A failed write keeps the buffer (retried an interval
        later, same event ids); a run ended elsewhere ends the thread (the writer's own next
        write says so)."""
        assert self._interval is not None
        while True:
            with self._lock:
                if not self._pending or self._stop.is_set():
                    self._flusher = None
                    return
                wait = self._oldest + self._interval - time.monotonic()
                if wait <= 0:
                    try:
                        self._flush()
                        continue
                    except RunStateError:
                        self._flusher = None
                        return
                    except Exception:
                        _log.warning("RunLog(%r): a timed flush failed", self.run_id, exc_info=True)
                        wait = self._interval
            if self._stop.wait(wait):
                with self._lock:
                    self._flusher = None
                return

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state = "closed"
        if not self._register:
            return
        self._stop.set()
        with self._lock:
            flusher = self._flusher
        if flusher is not None:
            flusher.join()
        try:
            self._flush()
        except RunStateError:
            raise  # the run was ended elsewhere: there is nothing more to write to it
        except BaseException as flush_error:
            self._finish(exc or flush_error)
            raise
        self._finish(exc)

    def _finish(self, error: BaseException | None) -> None:
        now = self._clock()
        if error is None:
            event = NewEvent(COMPLETED, {"finished_at": now})
        else:
            text = f"{type(error).__name__}: {error}"[:ERROR_MAX]
            event = NewEvent(FAILED, {"finished_at": now, "reason": "error", "error": text})
        self._append([self._store.prepare(event)], self._version)
        release_lease(self._store, self.run_id)

    def _append(self, events: list[PreparedEvent], expected: int, *, shown: bool = False) -> None:
        """Append to the run's stream at version `expected` (what this writer last wrote); a
        stream that moved means the run was ended elsewhere: RunStateError, nothing written.

        Events no other code has held are written unchecked (`Store._append_unexposed`); once
        `shown` (to the projections of a write that failed), as any caller's."""
        stream = stream_of(self.run_id)
        try:
            if shown:
                recorded = self._store.append_prepared(stream, events, expected_version=expected)
            else:
                recorded = self._store._append_unexposed(stream, events, expected)
        except ConcurrencyError:
            raise RunStateError(self._ended_elsewhere()) from None
        self._version = recorded[-1].version

    def _ended_elsewhere(self) -> str:
        info = run_info(self._store, self.run_id)
        why = f" ({info['reason']}: {info['error']})" if info["reason"] else ""
        return (
            f"run {self.run_id!r} is {info['status']}{why}, ended by another writer: "
            "nothing more can be written to it"
        )

    # -- writing --------------------------------------------------------------------------------

    def record_prediction(
        self,
        question_id: str,
        *,
        unit_id: str,
        prediction: Any,
        correct: bool | None,
        stop_reason: str,
        **fields: Any,
    ) -> None:
        """Buffer one prediction (validated now); a full buffer is flushed in one transaction.

        Recording a question again replaces its prediction in `predictions()` (the log keeps both).
        """
        self._require_writable()
        problem = outcome_problem(correct, stop_reason)
        if problem is not None:
            raise DomainInputError(f"prediction {question_id!r:.80}: {problem}")
        data = {
            "question_id": check_id("question_id", question_id),
            "unit_id": check_id("unit_id", unit_id),
            "prediction": prediction,
            "correct": correct,
            "stop_reason": stop_reason,
            "fields": check_fields("fields", fields, PREDICTION_KEYS) if fields else {},
        }
        try:
            # Validated once, now; the id is fixed too, so a flush retried after an error is
            # exactly-once.
            event = self._store.prepare(NewEvent(PREDICTION_RECORDED, data))
        except EventValidationError as e:
            raise DomainInputError(f"prediction {question_id!r}: {e}") from None
        with self._lock:
            if not self._pending:
                self._oldest = time.monotonic()
            self._pending.append(event)
            if len(self._pending) >= self._batch_size:
                self._flush()
            if self._pending:
                self._start_flusher()

    def flush(self) -> int:
        """Write the buffered predictions now (one transaction); how many were written."""
        self._require_writable()
        with self._lock:
            return self._flush()

    def heartbeat(self) -> None:
        """Refresh the run's lease, so `mark_stale_runs` knows its process is alive."""
        self._require_writable()
        with self._lock:
            if run_version(self._store, self.run_id) != self._version:
                raise RunStateError(self._ended_elsewhere())
            self._beat(self._clock())

    def _flush(self) -> int:
        if not self._pending:
            return 0
        # On error the buffer is kept: the next flush retries it with the same event ids.
        try:
            self._append(self._pending, self._version, shown=self._pending_shown)
        except BaseException:
            self._pending_shown = True
            raise
        written, self._pending, self._pending_shown = len(self._pending), [], False
        now = self._clock()
        if self._last_heartbeat is None or now - self._last_heartbeat >= HEARTBEAT_INTERVAL:
            self._beat(now)
        return written

    def _beat(self, now: datetime) -> None:
        write_lease(self._store, self.run_id, host=self._host, pid=self._pid, now=now)
        self._last_heartbeat = now

    def _require_writable(self) -> None:
        if not self._register:
            raise RunStateError(
                f"RunLog({self.run_id!r}) was opened with register_run=False: it only reads"
            )
        if self._state != "open":
            raise RunStateError(f"RunLog({self.run_id!r}) is {self._state}: write inside `with`")

    # -- reading --------------------------------------------------------------------------------

    def predictions(self) -> list[dict[str, Any]]:
        """The run's predictions (buffered ones are flushed first): question_id, unit_id,
        prediction, correct, stop_reason and the extra fields, in first-recorded order."""
        if self._state == "open" and self._register:
            with self._lock:
                self._flush()
        return read_predictions(self._store, self.run_id)

    def info(self) -> dict[str, Any]:
        """`run_info` of this run."""
        return run_info(self._store, self.run_id)
