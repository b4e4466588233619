"""The concurrency limiter's invariants, as a state machine over real asyncio tasks: the limit
stays within [1, ceiling], no slot is granted at or over the limit, nobody waits while a slot is
free, waiters are served in order, and a waiter that gives up (its deadline) holds nothing."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trm_llm import ConcurrencyLimiter, LLMConfigError, SseAnomaly, is_overload_signal
from trm_llm.limiter import FLOOR, Slot


class CheckedLimiter(ConcurrencyLimiter):
    """Asserts at every grant that the slot fits under the limit."""

    def _grant(self) -> Slot:
        assert self.in_flight < self.limit, (self.in_flight, self.limit)
        return super()._grant()


class LimiterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tasks: list[asyncio.Task[Slot]] = []  # waiting or granted, in arrival order
        self.held: list[Slot] = []
        self.served: list[int] = []  # arrival numbers, in the order their slots came
        self.order: dict[asyncio.Task[Slot], int] = {}

    def teardown(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()

    @initialize(
        initial=st.integers(1, 8),
        extra=st.integers(0, 8),
        backoff=st.sampled_from([0.5, 0.7, 0.9]),
        patience=st.integers(1, 5),
    )
    def build(self, initial: int, extra: int, backoff: float, patience: int) -> None:
        self.limiter = CheckedLimiter(
            initial, ceiling=initial + extra, backoff=backoff, patience=patience
        )

    def _settle(self) -> None:
        self.loop.run_until_complete(asyncio.sleep(0))
        for task in list(self.tasks):
            if task.done():
                self.tasks.remove(task)
                if not task.cancelled():
                    self.held.append(task.result())
                    self.served.append(self.order[task])

    @rule()
    def arrive(self) -> None:
        task = self.loop.create_task(self.limiter.acquire())
        self.order[task] = len(self.order)
        self.tasks.append(task)
        self._settle()

    @precondition(lambda self: bool(self.tasks))
    @rule(data=st.data())
    def give_up(self, data: st.DataObject) -> None:
        """A waiter's deadline passes (asyncio.timeout cancels it)."""
        task = data.draw(st.sampled_from(self.tasks))
        task.cancel()  # a slot granted to it just before is given back (in_flight == held)
        self._settle()
        assert task.cancelled()

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), outcome=st.sampled_from(["success", "overload", "neutral"]))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        slot = data.draw(st.sampled_from(self.held))
        self.held.remove(slot)
        before = self.limiter.limit
        release = self.limiter.release(slot, outcome)  # type: ignore[arg-type]
        if outcome != "overload":
            assert not release.handled
        elif release.change is not None:
            assert release.handled and release.change.to_limit < before
        if release.change is not None:
            assert (release.change.from_limit, release.change.to_limit) == (
                before,
                self.limiter.limit,
            )
        self._settle()

    @invariant()
    def limit_within_bounds(self) -> None:
        if hasattr(self, "limiter"):
            assert FLOOR <= self.limiter.limit <= self.limiter.ceiling

    @invariant()
    def in_flight_is_the_slots_held(self) -> None:
        if hasattr(self, "limiter"):
            assert self.limiter.in_flight == len(self.held)

    @invariant()
    def nobody_waits_for_a_free_slot(self) -> None:
        if hasattr(self, "limiter") and self.limiter.waiting:
            assert self.limiter.in_flight >= self.limiter.limit

    @invariant()
    def first_come_first_served(self) -> None:
        assert self.served == sorted(self.served)


TestLimiterMachine = LimiterMachine.TestCase
TestLimiterMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


async def test_a_waiter_times_out_at_its_deadline_holding_nothing() -> None:
    limiter = ConcurrencyLimiter(1, ceiling=1)
    slot = await limiter.acquire()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await limiter.acquire()
    assert 0.04 <= loop.time() - started < 1.0
    assert (limiter.in_flight, limiter.waiting) == (1, 0)
    limiter.release(slot, "success")
    assert limiter.in_flight == 0
    assert isinstance(await asyncio.wait_for(limiter.acquire(), 1.0), Slot)


def test_one_overload_episode_shrinks_the_limit_once() -> None:
    async def main() -> None:
        limiter = ConcurrencyLimiter(8, ceiling=8)
        slots = [await limiter.acquire() for _ in range(8)]
        releases = [limiter.release(s, "overload") for s in slots]  # the server cut them all
        assert all(r.handled for r in releases)
        changes = [r.change for r in releases if r.change is not None]
        assert [(c.from_limit, c.to_limit, c.cause) for c in changes] == [(8, 4, "overload")]
        assert limiter.limit == 4

    asyncio.run(main())


def test_an_overload_alone_at_the_floor_is_not_handled() -> None:
    """At a limit of 1 with this call alone, fewer calls cannot help: the breaker must hear."""

    async def main() -> None:
        limiter = ConcurrencyLimiter(1, ceiling=4)
        assert not limiter.release(await limiter.acquire(), "overload").handled
        assert limiter.limit == 1

    asyncio.run(main())


def test_the_limit_grows_on_success_to_the_ceiling_and_slowly_past_an_overload() -> None:
    async def grow(limiter: ConcurrencyLimiter, until: int) -> int:
        """Saturated successes until the limit reaches `until`; how many it took."""
        n = 0
        while limiter.limit < until:
            slots = [await limiter.acquire() for _ in range(limiter.limit)]
            for s in slots:
                limiter.release(s, "success")
                n += 1
        return n

    async def main() -> None:
        limiter = ConcurrencyLimiter(1, ceiling=3, patience=10)
        fast = await grow(limiter, 3)
        assert limiter.limit == 3
        await grow(limiter, 3)
        slots = [await limiter.acquire() for _ in range(3)]
        limiter.release(slots[0], "overload")  # overloaded at 3: down to 1
        for s in slots[1:]:
            limiter.release(s, "neutral")
        assert limiter.limit == 1
        to_two = await grow(limiter, 2)  # below the overloaded level: at the normal pace
        slow = await grow(limiter, 3)  # back to the level that overloaded: 10 times slower
        assert to_two <= fast and slow >= 10 * 2

    asyncio.run(main())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial": 0}, "initial"),
        ({"initial": 5, "ceiling": 4}, "must not exceed"),
        ({"ceiling": True}, "ceiling"),
        ({"backoff": 1.0}, "backoff"),
        ({"patience": 0}, "patience"),
    ],
)
def test_bad_limiter_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(LLMConfigError, match=message):
        ConcurrencyLimiter(**kwargs)  # type: ignore[arg-type]


def _status(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://x/chat/completions")
    return httpx.HTTPStatusError("x", request=request, response=httpx.Response(code))


@pytest.mark.parametrize(
    ("error", "status", "overload"),
    [
        (httpx.RemoteProtocolError("peer closed"), 200, True),
        (httpx.RemoteProtocolError("peer closed"), None, True),
        (httpx.ReadError("reset"), 200, True),
        (httpx.ReadError("reset"), None, False),  # no reply at all: not known to be load
        (SseAnomaly("truncated_no_done"), 200, True),
        (SseAnomaly("stall_inter_token"), 200, False),
        (SseAnomaly("error_payload"), 200, False),
        (_status(429), 429, True),
        (_status(503), 503, True),
        (_status(500), 500, False),
        (httpx.ConnectError("refused"), None, False),
        (httpx.ConnectTimeout("slow"), None, False),
    ],
)
def test_overload_signals(error: BaseException, status: int | None, overload: bool) -> None:
    assert is_overload_signal(error, status) is overload
