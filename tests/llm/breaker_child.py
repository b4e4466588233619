"""Breakers in a second process, driven line by line over stdin/stdout (JSON), through the
async API on one event loop: `python breaker_child.py PORT THRESHOLD COOLDOWN`; each command
names the Redis namespace of its breaker."""

from __future__ import annotations

import asyncio
import json
import sys

import redis.asyncio

from trm_llm.breaker import Admission, CircuitBreaker, Transition


def _change(t: Transition | None) -> list[str] | None:
    return [t.from_state, t.to_state] if t else None


async def serve(client: redis.asyncio.Redis, threshold: int, cooldown: float) -> None:
    loop = asyncio.get_running_loop()
    breakers: dict[str, CircuitBreaker] = {}
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        cmd = json.loads(line)
        ns = cmd["ns"]
        if ns not in breakers:
            breakers[ns] = CircuitBreaker(
                threshold, cooldown, 600.0, redis_client=client, namespace=ns, redis_timeout_s=10.0
            )  # Redis stays reachable here: a loaded machine must not degrade it to local state
        breaker = breakers[ns]
        op, now = cmd["op"], cmd["now"]
        ticket = Admission(True, cmd.get("token"))
        if op == "admit":
            a = await breaker.aadmit("p", now)
            reply = {"allowed": a.allowed, "token": a.probe_token, "change": _change(a.transition)}
        elif op == "success":
            t = await breaker.arecord_success("p", now=now, admission=ticket)
            reply = {"change": _change(t)}
        elif op == "failure":
            reply = {"change": _change(await breaker.arecord_failure("p", now, admission=ticket))}
        else:
            s = await breaker.asnapshot("p", now)
            reply = {"state": s.state, "failures": s.failures}
        print(json.dumps(reply), flush=True)
    for breaker in breakers.values():
        await breaker.aclose()


def main() -> None:
    port, threshold, cooldown = sys.argv[1:4]
    client = redis.asyncio.Redis(host="127.0.0.1", port=int(port))
    asyncio.run(serve(client, int(threshold), float(cooldown)))


if __name__ == "__main__":
    main()
