"""Overhead of the governed client, each figure a ratio against a reference run in the same process.

1. Streaming: N completions of T tokens at concurrency C from the loopback simulated server
   (in a subprocess, so it does not share this event loop), through `GovernedLLMClient` (cache
   and breaker off; SSE completeness and stall timers on) vs plain httpx + httpx-sse doing the
   least a correct consumer does (parse each chunk, join content). Two references: "plain" reads
   the body to its end after [DONE], as the OpenAI SDK and the governed client do, so the
   connection goes back to the pool; "plain-break" stops at [DONE], which makes httpx drop the
   connection (a new TCP connection per call). The governed client runs without a sink, and
   with `StoreEventSink` on SQLite (durability normal, and full: fsync per commit) and on
   PostgreSQL (127.0.0.1, database test, a fresh schema), each with its store work in a writer
   thread of this process (`StoreEventSink(store)`) and in a child process
   (`StoreEventSink.in_child_process(url)`), where each `chat()` returns once its event is
   committed (checked at the end: every call is in its store). Each side also reports
   the event loop's worst lag in a round (a 1 ms ticker's longest overshoot), median over the
   rounds, and the longest full (generation 2) collection of the cyclic garbage collector in a
   round. Targets: governed (alone, and + sink on every backend) / plain <= 1.15 wall; the
   loop's worst lag with a sink within 10 ms of the governed client's without one.

   The collector: httpx leaves about 45 objects in reference cycles per request (Request,
   Response, their streams; plain httpx as much as the governed client, with or without a
   sink), so full collections keep coming, each a pass over every object of the process: 75-135
   ms with this bench's ~140,000 (the stores, SQLAlchemy, pydantic, httpx), and whichever side
   runs then gets the pause as loop lag. With `--gc frozen` (the default) the objects that exist
   once every side is set up go to the collector's permanent generation (`gc.freeze()`, as a
   latency-minded service does after start-up), so a full collection passes over what the
   calls made since; `--gc default` leaves the collector as Python starts it.
2. Cache hit: `GovernedLLMClient.chat` served from `RedisResponseCache` (key build, GET, decode,
   event) and `RedisResponseCache.get` alone vs a raw redis-py GET of the same stored value.
   Target: cache.get / raw GET <= 1.5.

Run: .venv/bin/python bench/llm_bench.py [--n 1000] [--tokens 50] [--concurrency 32]
Needs Redis on 127.0.0.1:6379 for part 2 and PostgreSQL on 127.0.0.1:5432 for its sink side
(each skipped if unreachable). Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from httpx_sse import aconnect_sse
from redis.asyncio import Redis
from redis.exceptions import RedisError

from trm_llm import GovernedLLMClient, RedisResponseCache, StoreEventSink
from trm_llm.cache import CachedResponse
from trm_store import Store, open_store
from trm_store.backend import Durability

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

MESSAGES = [{"role": "user", "content": "Count to fifty."}]
TOKENS = 50


async def plain_call(http: httpx.AsyncClient, url: str, *, stop_at_done: bool = False) -> str:
    """The reference consumer: httpx + httpx-sse, no governance."""
    parts: list[str] = []
    body = {"model": "sim", "messages": MESSAGES, "stream": True}
    async with aconnect_sse(http, "POST", url, json=body) as source:
        source.response.raise_for_status()
        async for event in source.aiter_sse():
            if event.data == "[DONE]":
                if stop_at_done:
                    break
                continue
            for choice in json.loads(event.data).get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or "")
    return "".join(parts)


class LagMeter:
    """A task that asks to wake every millisecond and keeps the longest overshoot seen."""

    def __init__(self) -> None:
        self.worst_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            due = time.perf_counter() + 0.001
            await asyncio.sleep(0.001)
            self.worst_s = max(self.worst_s, time.perf_counter() - due)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class FullCollections:
    """The longest full (generation 2) collection of the cyclic GC while it is installed."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._began = 0.0

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.longest_s = max(self.longest_s, time.perf_counter() - self._began)

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._seen)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._seen)


async def run_many(
    n: int, concurrency: int, call: Callable[[], Awaitable[object]]
) -> tuple[float, float, float, float]:
    """Wall time, this process's CPU time, the loop's worst lag and the longest full GC
    collection of n calls with at most `concurrency` in flight."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await call()

    lag = LagMeter()
    lag.start()
    with FullCollections() as collections:
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one() for _ in range(n)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await lag.stop()
    return wall, cpu, lag.worst_s, collections.longest_s


@contextmanager
def pg_schema_url() -> Iterator[str | None]:
    """A fresh PostgreSQL schema for the sink (dropped afterwards), or None if unreachable."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    schema = "bench_" + uuid.uuid4().hex[:12]
    admin = create_engine(PG_URL)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError as exc:
        print(f"sink on PostgreSQL: skipped, unreachable ({type(exc).__name__})")
        admin.dispose()
        yield None
        return
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


BACKENDS = (
    ("sqlite-normal", "SQLite normal"),
    ("sqlite-full", "SQLite full"),
    ("postgresql", "PostgreSQL"),
)
WRITERS = (("thread", "thread writer"), ("child", "child-process writer"))


def sink_sides(
    stack: ExitStack, workdir: Path, writers: Sequence[str]
) -> tuple[dict[str, StoreEventSink], dict[str, Store]]:
    """One sink per writer and backend, each on a store of its own: SQLite normal, SQLite full,
    PostgreSQL (a fresh schema; skipped if unreachable). The thread writer appends through a
    store opened here; the child-process writer's child opens its own (`in_child_process`). The
    stores opened here are also how the bench counts what each side committed."""
    sinks: dict[str, StoreEventSink] = {}
    stores: dict[str, Store] = {}
    for writer in writers:
        locations: dict[str, tuple[str, Durability]] = {
            "sqlite-normal": (f"sqlite:///{workdir / f'{writer}-normal.db'}", "normal"),
            "sqlite-full": (f"sqlite:///{workdir / f'{writer}-full.db'}", "full"),
        }
        pg = stack.enter_context(pg_schema_url())
        if pg is not None:
            locations["postgresql"] = (pg, "normal")
        for backend, (url, durability) in locations.items():
            name = f"sink-{writer}-{backend}"
            store = stores[name] = open_store(url, durability=durability)
            stack.callback(store.close)
            sinks[name] = (
                StoreEventSink(store)
                if writer == "thread"
                else StoreEventSink.in_child_process(url, durability=durability)
            )
    return sinks, stores


SIDES = (
    ("plain", "plain httpx+httpx-sse, to EOF"),
    ("plain-break", "plain, stop at [DONE]"),
    ("governed", "GovernedLLMClient"),
    *(
        (f"sink-{writer}-{backend}", f"+ sink, {label}, {writer_label}")
        for writer, writer_label in WRITERS
        for backend, label in BACKENDS
    ),
)


async def streaming(
    base_url: str,
    n: int,
    tokens: int,
    concurrency: int,
    rounds: int,
    writers: Sequence[str],
    freeze: bool,
) -> None:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(30.0, read=None)
    with ExitStack() as stack, tempfile.TemporaryDirectory() as workdir:
        sinks, stores = sink_sides(stack, Path(workdir), writers)
        # one pool per side, as separate users would have
        pools = {name: httpx.AsyncClient(limits=limits, timeout=timeout) for name, _ in SIDES}
        url = f"{base_url}/chat/completions"
        clients = {
            name: GovernedLLMClient(base_url, "sim", http=pools[name], sink=sinks.get(name))
            for name in ("governed", *sinks)
        }
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "plain": lambda: plain_call(pools["plain"], url),
            "plain-break": lambda: plain_call(pools["plain-break"], url, stop_at_done=True),
        }
        for name, client in clients.items():
            calls[name] = lambda c=client: c.chat(MESSAGES)  # type: ignore[misc]
        expected = await plain_call(pools["plain"], url)
        for client in clients.values():
            assert (await client.chat(MESSAGES)).content == expected
        if freeze:  # every side is set up: what exists now is the process's, not the calls'
            gc.collect()
            gc.freeze()
        walls: dict[str, list[float]] = {name: [] for name in calls}
        cpus: dict[str, list[float]] = {name: [] for name in calls}
        lags: dict[str, list[float]] = {name: [] for name in calls}
        pauses: dict[str, list[float]] = {name: [] for name in calls}
        names = list(calls)
        for r in range(rounds):  # interleaved and rotated: drift and order hit every side alike
            k = r % len(names)
            for name in names[k:] + names[:k]:
                wall, cpu, lag, pause = await run_many(n, concurrency, calls[name])
                walls[name].append(wall)
                cpus[name].append(cpu)
                lags[name].append(lag)
                pauses[name].append(pause)
        for sink in sinks.values():
            await sink.aclose()
        for pool in pools.values():
            await pool.aclose()
        for name, store in stores.items():  # every acknowledged call is in its store
            recorded = len(store.read_stream("llm:sim"))
            assert recorded == rounds * n + 1, (name, recorded)
    wall_m = {name: statistics.median(values) for name, values in walls.items()}
    cpu_m = {name: statistics.median(values) for name, values in cpus.items()}
    lag_m = {name: statistics.median(values) * 1000 for name, values in lags.items()}
    lag_max = {name: max(values) * 1000 for name, values in lags.items()}
    pause_max = {name: max(values) * 1000 for name, values in pauses.items()}
    print(
        f"streaming: {n} completions of {tokens} tokens, concurrency {concurrency}, "
        f"median of {rounds} interleaved rounds (client CPU = this process only; loop lag = "
        "the worst of a round, median and max over the rounds; full GC = the longest full "
        f"collection of any round; collector {'frozen after set-up' if freeze else 'as started'})"
    )
    for name, label in SIDES:
        if name in wall_m:
            print(
                f"  {label:48s} wall {wall_m[name]:7.3f} s ({n / wall_m[name]:6.1f} calls/s)"
                f"  client CPU {cpu_m[name]:7.3f} s"
                f"  loop lag {lag_m[name]:6.1f} ms (max {lag_max[name]:6.1f})"
                f"  full GC {pause_max[name]:5.1f} ms"
            )
    for name in ("governed", *sinks):
        for ref in ("plain", "plain-break"):
            target = "   (target <= 1.15)" if ref == "plain" else ""
            print(
                f"  {name:32s} / {ref:12s} wall {wall_m[name] / wall_m[ref]:.3f}"
                f"  client CPU {cpu_m[name] / cpu_m[ref]:.3f}{target}"
            )
    for name in sinks:
        extra = lag_m[name] - lag_m["governed"]
        print(f"  {name:32s} loop lag - governed's: {extra:+.1f} ms   (target <= +10 ms)")


async def per_call_us(n: int, call: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """Wall and this process's CPU microseconds per call, n calls one after another."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await call()
    return (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6


async def cache_hit(base_url: str, n: int, rounds: int) -> None:
    redis = Redis(host="127.0.0.1", port=6379)
    namespace = f"bench:llm:{uuid.uuid4().hex}"
    try:
        await redis.ping()
    except (RedisError, OSError) as exc:
        print(f"cache hit: skipped, Redis unreachable ({exc})")
        return
    cache = RedisResponseCache(redis, ttl_s=600, namespace=namespace)
    try:
        async with GovernedLLMClient(base_url, "sim", cache=cache) as client:
            first = await client.chat(MESSAGES)  # the one miss: fills the cache
            key = cache.build_key("sim", MESSAGES, None, {}, endpoint=client.base_url)
            name = cache.redis_key(key)
            assert isinstance(await cache.get(key), CachedResponse)
            assert (await client.chat(MESSAGES)).cached and not first.cached
            for _ in range(200):  # warm-up
                await redis.get(name)
                await cache.get(key)
            calls: dict[str, Callable[[], Awaitable[object]]] = {
                "raw": lambda: redis.get(name),
                "get": lambda: cache.get(key),
                "chat": lambda: client.chat(MESSAGES),
            }
            walls: dict[str, list[float]] = {name: [] for name in calls}
            cpus: dict[str, list[float]] = {name: [] for name in calls}
            names = list(calls)
            for r in range(rounds):
                for label in names[r % 3 :] + names[: r % 3]:
                    wall, cpu = await per_call_us(n, calls[label])
                    walls[label].append(wall)
                    cpus[label].append(cpu)
        w = {k: statistics.median(v) for k, v in walls.items()}
        c = {k: statistics.median(v) for k, v in cpus.items()}
        print(
            f"cache hit: {n} sequential reads of a {len(first.content)}-char answer, "
            f"median of {rounds} interleaved rounds (CPU = this process only)"
        )
        for label, text in (
            ("raw", "raw redis GET"),
            ("get", "RedisResponseCache.get"),
            ("chat", "GovernedLLMClient.chat (hit)"),
        ):
            print(
                f"  {text:30s} wall {w[label]:6.1f} us (x{w[label] / w['raw']:.3f})"
                f"  CPU {c[label]:6.1f} us (x{c[label] / c['raw']:.3f})"
            )
        print("  target: RedisResponseCache.get / raw GET <= 1.5 (wall)")
    finally:
        keys = [k async for k in redis.scan_iter(match=f"{namespace}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cache-reads", type=int, default=2000)
    parser.add_argument(
        "--writers",
        default="thread,child",
        help="the sink writers to measure, comma-separated: thread, child (default: both)",
    )
    parser.add_argument(
        "--gc",
        choices=("frozen", "default"),
        default="frozen",
        help="freeze the set-up heap before the rounds (default), or leave the collector as is",
    )
    args = parser.parse_args()
    writers = [w for w in args.writers.split(",") if w]
    if not set(writers) <= {name for name, _ in WRITERS}:
        parser.error(f"--writers: choose from thread, child, not {args.writers!r}")
    server = subprocess.Popen(
        [sys.executable, "-m", "trm_llm.simulated_server", "--tokens", str(args.tokens)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().strip()
        asyncio.run(
            streaming(
                base_url,
                args.n,
                args.tokens,
                args.concurrency,
                args.rounds,
                writers,
                freeze=args.gc == "frozen",
            )
        )
        print()
        asyncio.run(cache_hit(base_url, args.cache_reads, args.rounds))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
