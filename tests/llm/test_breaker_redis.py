"""The Redis-shared breaker: one probe across two processes for every interleaving, and a stopped
or dead Redis that degrades to the local state in bounded time, without blocking the loop."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from trm_llm.breaker import Admission, CircuitBreaker, Transition
from trm_llm.errors import RetriesExhausted
from trm_llm.retry import RetryPolicy
from trm_llm.simulated_server import SimulatedServer, normal, status

from .breaker_model import COOLDOWN, THRESHOLD, BreakerMachine
from .conftest import USER, ClientFactory, FakeClock, ListSink
from .private_redis import PrivateRedis

CHILD = Path(__file__).with_name("breaker_child.py")
Change = tuple[str, str] | None


def _change(t: Transition | None) -> Change:
    return (t.from_state, t.to_state) if t else None


class ChildHandle:
    """The breaker of the second process."""

    def __init__(self, proc: subprocess.Popen[str], namespace: str) -> None:
        self.proc, self.namespace = proc, namespace

    def _ask(self, **cmd: object) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"ns": self.namespace, **cmd}) + "\n")
        self.proc.stdin.flush()
        reply: dict[str, object] = json.loads(self.proc.stdout.readline())
        return reply

    @staticmethod
    def _pair(change: object) -> Change:
        return (str(change[0]), str(change[1])) if isinstance(change, list) else None

    def admit(self, now: float) -> tuple[bool, str | None, Change]:
        r = self._ask(op="admit", now=now)
        token = r["token"]
        return (
            bool(r["allowed"]),
            token if isinstance(token, str) else None,
            self._pair(r["change"]),
        )

    def success(self, now: float, token: str | None) -> Change:
        return self._pair(self._ask(op="success", now=now, token=token)["change"])

    def failure(self, now: float, token: str | None) -> Change:
        return self._pair(self._ask(op="failure", now=now, token=token)["change"])

    def snapshot(self, now: float) -> tuple[str, int]:
        r = self._ask(op="snapshot", now=now)
        return str(r["state"]), int(str(r["failures"]))


class LocalAsyncHandle:
    """A breaker of this process, through the async API (the governed client's path)."""

    def __init__(self, breaker: CircuitBreaker, runner: asyncio.Runner) -> None:
        self.breaker, self.runner = breaker, runner

    def admit(self, now: float) -> tuple[bool, str | None, Change]:
        a = self.runner.run(self.breaker.aadmit("p", now))
        return a.allowed, a.probe_token, _change(a.transition)

    def success(self, now: float, token: str | None) -> Change:
        ticket = Admission(True, token)
        return _change(
            self.runner.run(self.breaker.arecord_success("p", now=now, admission=ticket))
        )

    def failure(self, now: float, token: str | None) -> Change:
        ticket = Admission(True, token)
        return _change(self.runner.run(self.breaker.arecord_failure("p", now, admission=ticket)))

    def snapshot(self, now: float) -> tuple[str, int]:
        s = self.runner.run(self.breaker.asnapshot("p", now))
        return s.state, s.failures


class TwoProcessMachine(BreakerMachine):
    def __init__(self, child: subprocess.Popen[str], shared: redis.Redis) -> None:
        super().__init__()
        self.shared = shared
        self.namespace = f"test:breaker:sm:{uuid.uuid4().hex}"
        self.runner = asyncio.Runner()
        self.local = CircuitBreaker(
            THRESHOLD,
            COOLDOWN,
            600.0,
            redis_client=shared,
            namespace=self.namespace,
            redis_timeout_s=10.0,  # reachable Redis: a loaded machine must not degrade it
        )
        self.handles = [
            LocalAsyncHandle(self.local, self.runner),
            ChildHandle(child, self.namespace),
        ]

    def expire_probe(self) -> None:  # the PX lease running out, without waiting 600 s
        self.shared.delete(f"{self.namespace}:p:probe")

    def teardown(self) -> None:
        self.runner.run(self.local.aclose())
        self.runner.close()
        self.shared.delete(f"{self.namespace}:p:state", f"{self.namespace}:p:probe")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), "6379", str(THRESHOLD), str(COOLDOWN)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


@pytest.mark.redis
def test_two_processes_sharing_redis_keep_exactly_one_probe(
    child: subprocess.Popen[str],
) -> None:
    shared = redis.Redis(host="127.0.0.1", port=6379)
    try:
        run_state_machine_as_test(
            lambda: TwoProcessMachine(child, shared),
            settings=settings(max_examples=40, stateful_step_count=30, deadline=None),
        )
    finally:
        shared.close()


class Ticker:
    """A task that wakes every 10 ms and keeps the longest gap it saw: a blocked loop shows."""

    def __init__(self) -> None:
        self.worst_gap_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            self.worst_gap_s = max(self.worst_gap_s, now - last)
            last = now

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def _resume_later(proc: subprocess.Popen[str], after_s: float) -> threading.Timer:
    """SIGCONT from a thread: if the loop were blocked, the test still ends (and fails)."""
    timer = threading.Timer(after_s, proc.send_signal, args=(signal.SIGCONT,))
    timer.start()
    return timer


def _shared_breaker(port: int, namespace: str, sink: ListSink) -> CircuitBreaker:
    plain = redis.Redis(host="127.0.0.1", port=port)  # no timeouts, as `trm diagnose` builds it
    return CircuitBreaker(
        fail_threshold=2,
        cooldown_s=10.0,
        redis_client=plain,
        namespace=namespace,
        redis_timeout_s=0.3,
        redis_retry_s=0.5,
        sink=sink,
    )


@pytest.mark.redis
async def test_a_stopped_redis_degrades_in_bounded_time_and_never_blocks_the_loop(
    private_redis: PrivateRedis,
    make_client: ClientFactory,
    sink: ListSink,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 15 point 3: with the synchronous client a SIGSTOPped Redis froze the loop for good.
    namespace = f"test:breaker:{uuid.uuid4().hex}"
    breaker = _shared_breaker(private_redis.port, namespace, sink)
    client = make_client(breaker=breaker)
    await client.chat(USER)  # healthy: the shared state is in use
    assert private_redis.proc is not None
    private_redis.proc.send_signal(signal.SIGSTOP)
    watchdog = _resume_later(private_redis.proc, 8.0)
    try:
        with Ticker() as ticker, caplog.at_level(logging.WARNING, logger="trm_llm.breaker"):
            started = time.perf_counter()
            first = await asyncio.wait_for(client.chat(USER), 5.0)
            first_s = time.perf_counter() - started
            started = time.perf_counter()
            for _ in range(5):  # degraded: the local state answers, no Redis wait per call
                await client.chat(USER)
            degraded_s = time.perf_counter() - started
        assert first.content == "Hello, world"
        assert first_s < 2.0, f"a call took {first_s:.2f} s with Redis stopped"
        assert degraded_s < 1.0
        assert ticker.worst_gap_s < 0.2, f"the loop stalled {ticker.worst_gap_s:.2f} s"
        assert [e["backend"] for e in sink.of("breaker_degraded")] == ["redis"]
        assert any("Redis unreachable" in r.getMessage() for r in caplog.records)
    finally:
        watchdog.cancel()
        private_redis.proc.send_signal(signal.SIGCONT)
    await asyncio.sleep(0.6)  # past redis_retry_s: the next call tries Redis again
    await client.chat(USER)
    assert len(sink.of("breaker_restored")) == 1
    check = redis.Redis(host="127.0.0.1", port=private_redis.port)
    state = {"state": "open", "failures": 2, "open_until": "1e12"}
    check.hset(f"{namespace}:sim:state", mapping=state)  # another process opened it
    assert (await breaker.asnapshot("sim", time.time())).state == "open"  # read through Redis
    check.close()
    await breaker.aclose()


@pytest.mark.redis
async def test_a_dead_redis_degrades_and_the_shared_state_returns_with_it(
    private_redis: PrivateRedis, make_client: ClientFactory, sink: ListSink, server: SimulatedServer
) -> None:
    namespace = f"test:breaker:{uuid.uuid4().hex}"
    breaker = _shared_breaker(private_redis.port, namespace, sink)
    client = make_client(breaker=breaker, clock=FakeClock(0.0), retry=RetryPolicy(max_attempts=1))
    private_redis.kill()
    server.script(status(500), status(500))
    for _ in range(2):  # the local state counts the failures and opens
        with pytest.raises(RetriesExhausted):
            await client.chat(USER)
    assert (await breaker.asnapshot("sim", 0.0)).state == "open"
    assert len(sink.of("breaker_degraded")) == 1
    private_redis.start()
    await asyncio.sleep(0.6)
    assert (await breaker.asnapshot("sim", 0.0)).state == "closed"  # Redis' state is the truth
    assert len(sink.of("breaker_restored")) == 1
    server.default = normal(["back"])
    assert (await client.chat(USER)).content == "back"
    await breaker.aclose()


@pytest.mark.redis
async def test_a_corrupt_shared_state_degrades_rather_than_fails_the_call(
    make_client: ClientFactory, sink: ListSink
) -> None:
    namespace = f"test:breaker:{uuid.uuid4().hex}"
    check = redis.Redis(host="127.0.0.1", port=6379)
    check.hset(f"{namespace}:sim:state", mapping={"state": "open", "failures": b"\xff\xfe"})
    try:
        breaker = _shared_breaker(6379, namespace, sink)
        assert (await make_client(breaker=breaker).chat(USER)).content == "Hello, world"
        assert "corrupt breaker state" in sink.of("breaker_degraded")[0]["detail"]
        await breaker.aclose()
    finally:
        check.delete(f"{namespace}:sim:state")
        check.close()
