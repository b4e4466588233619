"""Overhead of the governed client, each figure a ratio against a reference run in the same process.

1. Streaming: N completions of T tokens at concurrency C from the loopback simulated server
   (in a subprocess, so it does not share this event loop), through `GovernedLLMClient` (cache,
   breaker and sink off; SSE completeness and stall timers on) vs plain httpx + httpx-sse doing
   the least a correct consumer does (parse each chunk, join content). Two references:
   "plain" reads the body to its end after [DONE], as the OpenAI SDK and the governed client do,
   so the connection goes back to the pool; "plain-break" stops at [DONE], which makes httpx
   drop the connection (a new TCP connection per call). Target: governed / plain <= 1.15.
2. Cache hit: `GovernedLLMClient.chat` served from `RedisResponseCache` (key build, GET, decode,
   event) and `RedisResponseCache.get` alone vs a raw redis-py GET of the same stored value.
   Target: cache.get / raw GET <= 1.5.

Run: .venv/bin/python bench/llm_bench.py [--n 1000] [--tokens 50] [--concurrency 32]
Needs Redis on 127.0.0.1:6379 for part 2 (skipped if unreachable). Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

import httpx
from httpx_sse import aconnect_sse
from redis.asyncio import Redis
from redis.exceptions import RedisError

from trm_llm import GovernedLLMClient, RedisResponseCache
from trm_llm.cache import CachedResponse

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


async def run_many(
    n: int, concurrency: int, call: Callable[[], Awaitable[object]]
) -> tuple[float, float]:
    """Wall time and this process's CPU time of n calls with at most `concurrency` in flight."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await call()

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - wall, time.process_time() - cpu


async def streaming(base_url: str, n: int, tokens: int, concurrency: int, rounds: int) -> None:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(30.0, read=None)
    async with (  # one pool per side, as separate users would have
        httpx.AsyncClient(limits=limits, timeout=timeout) as plain_http,
        httpx.AsyncClient(limits=limits, timeout=timeout) as break_http,
        httpx.AsyncClient(limits=limits, timeout=timeout) as governed_http,
    ):
        client = GovernedLLMClient(base_url, "sim", http=governed_http)
        url = f"{base_url}/chat/completions"
        assert (await client.chat(MESSAGES)).content == await plain_call(plain_http, url)
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "plain": lambda: plain_call(plain_http, url),
            "plain-break": lambda: plain_call(break_http, url, stop_at_done=True),
            "governed": lambda: client.chat(MESSAGES),
        }
        walls: dict[str, list[float]] = {name: [] for name in calls}
        cpus: dict[str, list[float]] = {name: [] for name in calls}
        names = list(calls)
        for r in range(rounds):  # interleaved and rotated: drift and order hit every side alike
            for name in names[r % 3 :] + names[: r % 3]:
                wall, cpu = await run_many(n, concurrency, calls[name])
                walls[name].append(wall)
                cpus[name].append(cpu)
    wall_m = {name: statistics.median(values) for name, values in walls.items()}
    cpu_m = {name: statistics.median(values) for name, values in cpus.items()}
    print(
        f"streaming: {n} completions of {tokens} tokens, concurrency {concurrency}, "
        f"median of {rounds} interleaved rounds (client CPU = this process only)"
    )
    for name, label in (
        ("plain", "plain httpx+httpx-sse, to EOF"),
        ("plain-break", "plain, stop at [DONE]"),
        ("governed", "GovernedLLMClient"),
    ):
        print(
            f"  {label:30s} wall {wall_m[name]:7.3f} s ({n / wall_m[name]:6.1f} calls/s)"
            f"  client CPU {cpu_m[name]:7.3f} s"
        )
    for ref in ("plain", "plain-break"):
        print(
            f"  governed / {ref:12s} wall {wall_m['governed'] / wall_m[ref]:.3f}"
            f"  client CPU {cpu_m['governed'] / cpu_m[ref]:.3f}   (target <= 1.15)"
        )


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
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-m", "trm_llm.simulated_server", "--tokens", str(args.tokens)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().strip()
        asyncio.run(streaming(base_url, args.n, args.tokens, args.concurrency, args.rounds))
        print()
        asyncio.run(cache_hit(base_url, args.cache_reads, args.rounds))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
