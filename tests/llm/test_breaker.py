"""The circuit breaker state machine, in memory and shared through the local Redis."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis

from trm_llm.breaker import CircuitBreaker, Transition


def test_half_open_admits_single_probe() -> None:
    # Plan task 5, verbatim: after the cooldown only the first caller is let through.
    b = CircuitBreaker(fail_threshold=2, cooldown_s=10.0)
    b.record_failure("p", now=0.0)
    b.record_failure("p", now=0.0)  # open until t=10
    assert b.is_open("p", now=5.0) is True
    assert b.is_open("p", now=11.0) is False  # the probe
    assert b.is_open("p", now=11.0) is True  # the rest are rejected while it is in flight
    b.record_success("p")
    assert b.is_open("p", now=12.0) is False


def test_opens_only_after_consecutive_failures() -> None:
    b = CircuitBreaker(fail_threshold=3, cooldown_s=10.0)
    b.record_failure("p", 0.0)
    b.record_failure("p", 0.0)
    b.record_success("p")  # resets the streak
    b.record_failure("p", 1.0)
    b.record_failure("p", 1.0)
    assert b.is_open("p", 1.0) is False
    assert b.record_failure("p", 1.0) == Transition("p", "closed", "open", 3, 1.0)
    assert b.is_open("p", 1.0) is True
    assert b.is_open("other", 1.0) is False  # per source


def test_failed_probe_reopens_for_a_new_cooldown() -> None:
    b = CircuitBreaker(fail_threshold=1, cooldown_s=10.0)
    b.record_failure("p", 0.0)
    admission = b.admit("p", 10.0)
    assert admission.allowed and admission.probe_token is not None
    assert admission.transition == Transition("p", "open", "half_open", 1, 10.0)
    assert b.record_failure("p", 10.5) == Transition("p", "half_open", "open", 2, 10.5)
    assert b.is_open("p", 20.0) is True  # new cooldown runs to 20.5
    assert b.is_open("p", 20.5) is False  # next probe
    assert b.record_success("p") == Transition("p", "half_open", "closed", 0, None)


def test_probe_that_never_reports_loses_its_lease() -> None:
    b = CircuitBreaker(fail_threshold=1, cooldown_s=10.0, probe_timeout_s=5.0)
    b.record_failure("p", 0.0)
    assert b.is_open("p", 10.0) is False  # probe taken, never reports
    assert b.is_open("p", 14.9) is True
    assert b.is_open("p", 15.0) is False  # lease expired: a new probe
    assert b.is_open("p", 15.0) is True


def test_release_probe_frees_the_lease_only_for_its_holder() -> None:
    b = CircuitBreaker(fail_threshold=1, cooldown_s=10.0)
    b.record_failure("p", 0.0)
    token = b.admit("p", 10.0).probe_token
    assert token is not None
    b.release_probe("p", "not-the-token")
    assert b.is_open("p", 10.0) is True
    b.release_probe("p", token)
    assert b.is_open("p", 10.0) is False


def test_force_open() -> None:
    b = CircuitBreaker(fail_threshold=5, cooldown_s=10.0)
    assert b.force_open("p", 3.0) == Transition("p", "closed", "open", 5, 3.0)
    assert b.is_open("p", 12.9) is True
    assert b.is_open("p", 13.0) is False


def test_bad_configuration_is_refused() -> None:
    for kwargs in ({"fail_threshold": 0}, {"cooldown_s": -1.0}, {"probe_timeout_s": 0.0}):
        with pytest.raises(ValueError):
            CircuitBreaker(**kwargs)


def _admitted_by_threads(breakers: list[CircuitBreaker], now: float, per: int) -> int:
    admitted: list[bool] = []
    barrier = threading.Barrier(len(breakers) * per)

    def run(b: CircuitBreaker) -> None:
        barrier.wait()
        admitted.append(not b.is_open("p", now))

    threads = [threading.Thread(target=run, args=(b,)) for b in breakers for _ in range(per)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(admitted)


def test_threads_racing_at_cooldown_end_admit_one_probe() -> None:
    b = CircuitBreaker(fail_threshold=1, cooldown_s=10.0)
    b.record_failure("p", 0.0)
    assert _admitted_by_threads([b], 10.0, 32) == 1


@pytest.fixture
def shared() -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis(host="127.0.0.1", port=6379)
    namespace = f"test:breaker:{uuid.uuid4().hex}"
    yield client, namespace
    keys = list(client.scan_iter(match=f"{namespace}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def shared_breaker(client: redis.Redis, namespace: str, **kw: float) -> CircuitBreaker:
    """A breaker on the shared Redis, which these tests keep reachable: a generous Redis timeout,
    so a loaded machine (dozens of threads in WATCH retries) never degrades it to local state,
    the documented fallback that admits a probe per process (tested with private Redis servers
    that are stopped)."""
    kw.setdefault("redis_timeout_s", 10.0)
    return CircuitBreaker(
        fail_threshold=2, cooldown_s=10.0, redis_client=client, namespace=namespace, **kw
    )


@pytest.mark.redis
def test_redis_state_is_shared_between_instances(shared: tuple[redis.Redis, str]) -> None:
    client, ns = shared
    a, b, c = (shared_breaker(client, ns) for _ in range(3))
    a.record_failure("p", 100.0)
    assert b.record_failure("p", 100.0) == Transition("p", "closed", "open", 2, 100.0)
    assert c.is_open("p", 105.0) is True
    assert a.is_open("p", 110.0) is False  # the one probe, taken through instance a
    assert b.is_open("p", 110.0) is True
    assert c.is_open("p", 110.0) is True
    c.record_success("p")
    assert b.is_open("p", 111.0) is False
    assert set(client.scan_iter(match=f"{ns}:*")) == {f"{ns}:p:state".encode()}


@pytest.mark.redis
def test_redis_probe_lease_is_set_nx_with_the_probe_timeout(
    shared: tuple[redis.Redis, str],
) -> None:
    client, ns = shared
    b = shared_breaker(client, ns, probe_timeout_s=7.0)
    b.force_open("p", 0.0)
    token = b.admit("p", 10.0).probe_token
    assert client.get(f"{ns}:p:probe") == (token or "").encode()
    assert 0 < client.pttl(f"{ns}:p:probe") <= 7000
    # The lease expiring in Redis (simulated by deleting it) lets the next caller probe.
    client.delete(f"{ns}:p:probe")
    assert b.is_open("p", 10.0) is False
    assert b.is_open("p", 10.0) is True


@pytest.mark.redis
def test_redis_threads_on_many_instances_admit_one_probe(shared: tuple[redis.Redis, str]) -> None:
    client, ns = shared
    breakers = [shared_breaker(client, ns) for _ in range(4)]
    breakers[0].force_open("p", 0.0)
    assert _admitted_by_threads(breakers, 10.0, 16) == 1


CHILD = textwrap.dedent(
    """
    import sys, threading, time, redis
    from trm_llm.breaker import CircuitBreaker
    client = redis.Redis(host="127.0.0.1", port=6379)
    b = CircuitBreaker(fail_threshold=2, cooldown_s=10.0, redis_client=client,
                       namespace=sys.argv[1], redis_timeout_s=10.0)
    client.incr(sys.argv[1] + ":ready")
    while int(client.get(sys.argv[1] + ":ready")) < int(sys.argv[2]):
        time.sleep(0.001)
    admitted = []
    threads = [threading.Thread(target=lambda: admitted.append(not b.is_open("p", 10.0)))
               for _ in range(10)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(sum(admitted))
    """
)


@pytest.mark.redis
def test_redis_several_processes_admit_one_probe(shared: tuple[redis.Redis, str]) -> None:
    client, ns = shared
    shared_breaker(client, ns).force_open("p", 0.0)
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, ns, "3"], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    counts = [int(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(counts) == 1
