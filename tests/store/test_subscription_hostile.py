"""What a hostile review found `Store.subscribe` did, each fixed (`trm_store.subscription`):

- `position` moved to the end of a batch as it was read, before its events were handed out: a
  loop that stopped mid-batch (a break, a cancel, a handler that raised) and resumed from
  `position` lost the rest of the batch;
- a subscription closed while a batch was being handed out went on yielding it;
- `close()` from a signal handler of the iterating thread (how a service stops on SIGTERM) hung
  on the lock its own step held;
- each idle async subscription held a thread of asyncio's default executor: a few dozen starved
  every `to_thread` and `getaddrinfo` of the process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.store.helpers import added
from trm_store import Store

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 10


def _fill(store: Store) -> None:
    store.append_batch([(f"s{k % 3}", [added(k)], None) for k in range(EVENTS)])


def _positions(store: Store, after: int, **filters: Any) -> list[int]:
    return [e.position for e in store.read_all(after, **filters)]


@pytest.mark.parametrize("stop_after", [1, 2, EVENTS - 1])
@pytest.mark.parametrize("filters", [{}, {"stream_prefix": "s1"}])
def test_resuming_from_position_after_a_break_mid_batch_loses_nothing(
    store: Store, stop_after: int, filters: dict[str, Any]
) -> None:
    _fill(store)
    matching = _positions(store, 0, **filters)
    stop_after = min(stop_after, len(matching) - 1)
    subscription = store.subscribe(**filters)
    handed = []
    for event in subscription:
        handed.append(event.position)
        if len(handed) == stop_after:
            break
    assert subscription.position == handed[-1]
    assert handed + _positions(store, subscription.position, **filters) == matching


def test_a_handler_that_raises_leaves_position_at_the_last_event_handed_out(
    store: Store,
) -> None:
    _fill(store)
    subscription = store.subscribe()
    with pytest.raises(RuntimeError):
        for event in subscription:
            if event.position == 4:
                raise RuntimeError("the handler failed on event 4")
    assert subscription.position == 4


async def test_an_async_loop_cancelled_mid_batch_resumes_without_a_gap(store: Store) -> None:
    _fill(store)
    subscription = store.subscribe()
    handed: list[int] = []
    first_two = asyncio.Event()

    async def follow() -> None:
        async for event in subscription:
            handed.append(event.position)
            if len(handed) == 2:
                first_two.set()
                await asyncio.sleep(30)

    task = asyncio.create_task(follow())
    await first_two.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert subscription.position == 2
    assert handed + _positions(store, subscription.position) == list(range(1, EVENTS + 1))


@pytest.mark.parametrize("how", ["close", "store-close"])
def test_a_subscription_closed_mid_batch_yields_nothing_more(store_url: str, how: str) -> None:
    from trm_store import open_store

    with open_store(store_url, projections={}) as store:
        _fill(store)
        subscription = store.subscribe()
        handed = []
        for event in subscription:
            handed.append(event.position)
            if how == "close":
                subscription.close()
            else:
                store.close()
        assert handed == [1]


async def test_an_async_subscription_closed_mid_batch_yields_nothing_more(store: Store) -> None:
    _fill(store)
    subscription = store.subscribe()
    handed = []
    async for event in subscription:
        handed.append(event.position)
        await subscription.aclose()
    assert handed == [1]


_SIGNAL_CLOSE = """
import signal, sys
from trm_store import open_store
from tests.store.helpers import added
with open_store(sys.argv[1], projections={}) as store:
    store.append("s", [added(1)])
    subscription = store.subscribe()
    close = subscription.close if sys.argv[2] == "close" else store.close
    signal.signal(signal.SIGALRM, lambda *_: close())
    signal.setitimer(signal.ITIMER_REAL, 0.5)  # while the loop waits for a commit
    print([e.position for e in subscription], flush=True)
"""


@pytest.mark.parametrize("how", ["close", "store-close"])
def test_closing_from_a_signal_handler_ends_the_loop(store_url: str, how: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SIGNAL_CLOSE), store_url, how],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[1]"


class _CountingExecutor(ThreadPoolExecutor):
    """asyncio's default executor, counting what it is given."""

    calls = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        _CountingExecutor.calls += 1
        return super().submit(*args, **kwargs)


async def test_idle_async_subscriptions_leave_the_default_executor_alone(store: Store) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(_CountingExecutor(max_workers=2))
    store.append("s", [added(1)])
    arrived = asyncio.Queue[int]()

    async def follow() -> None:
        async for event in store.subscribe():
            await arrived.put(event.position)

    tasks = [asyncio.create_task(follow()) for _ in range(8)]
    assert sorted([await arrived.get() for _ in tasks]) == [1] * len(tasks)
    _CountingExecutor.calls = 0
    await asyncio.sleep(0.5)  # five steps' waits each
    idle_calls = _CountingExecutor.calls
    store.append("s", [added(2)])
    assert sorted([await arrived.get() for _ in tasks]) == [2] * len(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert idle_calls == 0
