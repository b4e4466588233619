"""Interrupts raised at every place where CPython could raise one in the code under test: the
tracer that tests/store/test_group_commit_interrupts.py and
tests/store/test_write_transaction_interrupts.py share.

A signal's handler (or `PyThreadState_SetAsyncExc`) runs at the interpreter's next check for
pending calls: where a Python function starts, after a call returns, at a loop's jump back, and
in a blocking wait. Raising at each such place in turn, one run per place, visits every place a
KeyboardInterrupt can land.
"""

from __future__ import annotations

import dis
import gc
import linecache
import sys
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["LIMIT", "InterruptAt", "Interrupted", "raised_after", "traced_by", "wait_for"]

LIMIT = 30.0
"""Seconds a thread of these tests may take to end."""

_CALLS = {dis.opmap["CALL"], dis.opmap["CALL_FUNCTION_EX"], dis.opmap["BEFORE_WITH"]}
_WITH = dis.opmap["BEFORE_WITH"]
_JUMP_BACK = dis.opmap["JUMP_BACKWARD"]


class Interrupted(BaseException):
    """What the tests raise in a thread: an interrupt, as KeyboardInterrupt is."""


class InterruptAt:
    """A trace function that raises `Interrupted` at the `at`-th place in this thread where
    the code of the `traced` files can be interrupted, and again `then` places later if given
    (a second Ctrl-C while the first is handled); `places` counts them, `where` names those it
    raised at.

    The places, in the traced files' frames: where each function they call starts, after each
    call returns, at each loop's jump back, and before each wait for a lock (`with`,
    `acquire`: interrupted before it took the lock); with `own_starts`, also where each of
    their own functions starts, whoever calls it."""

    def __init__(
        self,
        at: int,
        then: int | None = None,
        *,
        traced: Collection[str],
        own_starts: bool = False,
    ) -> None:
        self.at = at
        self.last = at if then is None else at + then
        self.places = 0
        self.where: list[str] = []
        self._traced = traced
        self._own_starts = own_starts
        self._called: set[int] = set()
        """The frames whose last instruction was a call."""

    def _place(self, where: str) -> None:
        self.places += 1
        if self.places in (self.at, self.last):
            self.where.append(where)
            if self.places == self.last:
                sys.settrace(None)
            raise Interrupted(f"at place {self.places}: {where}")

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> InterruptAt | None:
        if event == "call":
            caller = frame.f_back
            traced = frame.f_code.co_filename in self._traced
            if (traced and self._own_starts) or (
                caller is not None and caller.f_code.co_filename in self._traced
            ):
                self._place(f"start of {frame.f_code.co_qualname}")
            if not traced:
                return None
            frame.f_trace_lines = False
            frame.f_trace_opcodes = True
            return self
        if event == "exception":  # raised at the check after a call: that place is passed
            self._called.discard(id(frame))
        if event == "opcode":
            op = frame.f_code.co_code[frame.f_lasti]
            key = id(frame)
            where = f"{frame.f_code.co_qualname}+{frame.f_lasti}"
            if key in self._called:
                self._called.discard(key)
                self._place(f"after the call before {where}")
            if op == _JUMP_BACK:
                self._place(f"jump back at {where}")
            elif op in _CALLS:
                line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
                if op == _WITH or "acquire(" in line:
                    self._place(f"before the wait at {where}")
                self._called.add(key)
        return self


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Until `condition` holds; fails the test, naming `what`, after `LIMIT` seconds."""
    deadline = time.monotonic() + LIMIT
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)


def at_each_place(run: Callable[[int], tuple[InterruptAt, object]], *, more_than: int) -> None:
    """`run(at)`, which traces a call with a tracer for place `at` and returns that tracer and
    the call's outcome, for at = 1, 2, ... until a run passes fewer places than `at` (each
    place was visited): every earlier outcome an `Interrupted`, that last one the call's result
    (a list of events); more than `more_than` places in all (the runs did interrupt it)."""
    for at in range(1, 400):
        tracer, outcome = run(at)
        if tracer.places < at:
            assert isinstance(outcome, list), f"run {at}: {outcome!r}"
            assert at > more_than, at
            return
        assert isinstance(outcome, Interrupted), f"run {at}: {outcome!r}"
    raise AssertionError("the traced call kept making calls: the runs never reached its end")


def outcome_of(call: Callable[[], object]) -> object:
    """What `call` returned, or the exception it raised (an interrupt included)."""
    try:
        return call()
    except BaseException as e:
        return e


@contextmanager
def raised_after(call: str, caller: str, raised: BaseException, nth: int = 1) -> Iterator[None]:
    """`raised` where the `nth` call of the C function named `call` made by a function named
    `caller` returns: where CPython runs a signal handler that became pending during that call
    (the check after it), and where what the handler raises comes out. An alarm's handler
    raising `TimeoutError()` (an OSError without errno), or Ctrl-C."""
    seen = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal seen
        if (
            event == "c_return"
            and getattr(arg, "__name__", None) == call
            and frame.f_code.co_name == caller
        ):
            seen += 1
            if seen == nth:
                sys.setprofile(None)
                raise raised

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)
    assert seen >= nth, f"{call} returned to {caller} {seen} times, not {nth}"


@contextmanager
def traced_by(tracer: InterruptAt) -> Iterator[None]:
    """This thread traced by `tracer` while the block runs, an `Interrupted` it raises
    caught; no garbage collected meanwhile: a finalizer the collector ran there (another
    test's store's, in the whole suite) could start a function of a traced file, which would
    count as a place and swallow the interrupt raised at it."""
    gc.collect()
    gc.disable()
    sys.settrace(tracer)
    try:
        yield
    except Interrupted:
        pass
    finally:
        sys.settrace(None)
        gc.enable()
