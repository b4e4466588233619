"""A loopback OpenAI-compatible `/chat/completions` server that can misbehave on purpose.

Tests and `trm demo` use it to show each failure the governed client must survive: a stream cut
before `[DONE]`, a reset mid-stream, stalls, keep-alive comments, 429/500/401, error payloads in
a 200 stream, llama.cpp's unframed final `[DONE]`, a usage-only last chunk, reasoning deltas, a
`length` finish. It is a raw asyncio socket server (HTTP/1.1, chunked, keep-alive) on 127.0.0.1,
so faults happen at the byte level where real ones do.

What a request gets: the next `Reply` queued with `script()`, else the named scenario marked in
the last user message (`[[sim:cut]]`, see `SCENARIOS`), else `default`.

With `max_in_flight=K` it serves only K requests at once, like llama.cpp's server with few slots:
beyond K, `overload="cut"` cuts every stream then in flight (the body ends mid-chunk, the
connection closes: the client sees `RemoteProtocolError`), `overload="503"` answers the extra
request 503 at once. `overloaded` counts the requests it turned away or cut, `peak_in_flight` the
most it had at once.

    async with SimulatedServer() as server:
        server.script(cut(after=2), normal(["hi"]))
        ... GovernedLLMClient(server.base_url, "sim") ...
        assert server.request_count == 2
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import re
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "SCENARIOS",
    "Reply",
    "SimulatedServer",
    "cut",
    "error_payload",
    "malformed",
    "normal",
    "reset",
    "sse",
    "stall",
    "status",
    "wrong_content_type",
]

SSE_HEADERS = (("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"))
_MARKER = re.compile(r"\[\[sim:([a-z_]+)\]\]")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class Reply:
    """One response: body pieces written as they come (a float is a pause in seconds).

    `ending`: "complete" ends the HTTP message properly, "drop" closes the socket mid-body
    (FIN), "reset" aborts it (SO_LINGER 0, so the peer sees RST).
    """

    status: int = 200
    headers: tuple[tuple[str, str], ...] = SSE_HEADERS
    steps: tuple[bytes | float, ...] = ()
    ending: Literal["complete", "drop", "reset"] = "complete"


@dataclass(frozen=True)
class ReceivedRequest:
    """What the server saw: the path, lower-cased headers and the JSON body."""

    path: str
    headers: dict[str, str]
    body: Any


def sse(payload: Any, *, framed: bool = True) -> bytes:
    """One `data:` event; `framed=False` omits the blank line that should end it."""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode() if framed else f"data: {data}".encode()


def _chunk(delta: dict[str, Any], finish: str | None = None, model: str = "sim") -> bytes:
    return sse(
        {
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def _tokens(tokens: Sequence[str], delay_s: float) -> list[bytes | float]:
    steps: list[bytes | float] = []
    for token in tokens:
        if delay_s:
            steps.append(delay_s)
        steps.append(_chunk({"content": token}))
    return steps


def normal(
    tokens: Sequence[str] = ("Hello", ",", " world"),
    *,
    finish: str = "stop",
    reasoning: Sequence[str] = (),
    reasoning_key: str = "reasoning_content",
    usage: bool = True,
    done: Literal["framed", "unframed"] = "framed",
    delay_s: float = 0.0,
) -> Reply:
    """A complete answer: optional reasoning deltas, content, finish, usage-only chunk, [DONE]."""
    steps: list[bytes | float] = [_chunk({"role": "assistant"})]
    steps += [_chunk({reasoning_key: r}) for r in reasoning]
    steps += _tokens(tokens, delay_s)
    steps.append(_chunk({}, finish))
    if usage:
        n = len(tokens) + len(reasoning)
        counts = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
        steps.append(sse({"object": "chat.completion.chunk", "choices": [], "usage": counts}))
    steps.append(sse("[DONE]", framed=done == "framed"))
    return Reply(steps=tuple(steps))


def cut(after: int = 2, *, ending: Literal["complete", "drop"] = "complete") -> Reply:
    """`after` tokens then the body ends without a finish or [DONE] (a clean end, or FIN)."""
    return Reply(steps=tuple(_tokens(["tok"] * after, 0.0)), ending=ending)


def reset(after: int = 2) -> Reply:
    """`after` tokens then a TCP reset mid-stream."""
    return Reply(steps=tuple(_tokens(["tok"] * after, 0.0)), ending="reset")


def stall(
    seconds: float,
    *,
    after: int = 0,
    keepalive_every_s: float | None = None,
    comment: bytes = b": keep-alive\n\n",
    then: Reply | None = None,
) -> Reply:
    """`after` tokens, then `seconds` without data (keep-alive comments if asked), then `then`."""
    steps: list[bytes | float] = list(_tokens(["tok"] * after, 0.0))
    if keepalive_every_s:
        for _ in range(max(1, int(seconds / keepalive_every_s))):
            steps += [keepalive_every_s, comment]
    else:
        steps.append(seconds)
    rest = then if then is not None else normal()
    return Reply(steps=(*steps, *rest.steps), ending=rest.ending)


def status(code: int, body: Any = None, *, retry_after: str | None = None) -> Reply:
    """A non-200 JSON response, e.g. 429 with Retry-After, 500, 401."""
    headers = [("Content-Type", "application/json")]
    if retry_after is not None:
        headers.append(("Retry-After", retry_after))
    payload = body if body is not None else {"error": {"message": f"simulated {code}"}}
    return Reply(status=code, headers=tuple(headers), steps=(json.dumps(payload).encode(),))


def error_payload(kind: Literal["error", "object", "finish_error", "finish_abort"]) -> Reply:
    """A 200 stream that turns into an error after one token."""
    bad: bytes = {
        "error": sse({"error": {"message": "upstream overloaded", "code": 503}}),
        "object": sse({"object": "error", "message": "upstream overloaded"}),
        "finish_error": _chunk({}, "error"),
        "finish_abort": _chunk({}, "abort"),
    }[kind]
    return Reply(steps=(_chunk({"content": "par"}), bad, sse("[DONE]")))


def malformed() -> Reply:
    """A 200 stream with a data line that is not JSON."""
    return Reply(steps=(_chunk({"content": "x"}), b'data: {"choices": [\n\n', sse("[DONE]")))


def wrong_content_type() -> Reply:
    """A 200 with a JSON body: the endpoint does not stream (a misconfiguration, not a blip)."""
    return Reply(headers=(("Content-Type", "application/json"),), steps=(b'{"choices": []}',))


SCENARIOS: dict[str, Callable[[], Reply]] = {
    "normal": normal,
    "cut": cut,
    "drop": lambda: cut(ending="drop"),
    "reset": reset,
    "stall": lambda: stall(5.0),
    "rate_limit": lambda: status(429, retry_after="1"),
    "server_error": lambda: status(500),
    "unauthorized": lambda: status(401),
    "error_payload": lambda: error_payload("error"),
    "unframed_done": lambda: normal(done="unframed"),
    "length": lambda: normal(finish="length"),
    "reasoning": lambda: normal(reasoning=["Let me think. "]),
}


class _InFlight:
    """One request being answered; `cut` is set when an overload breaks its stream."""

    __slots__ = ("cut",)

    def __init__(self) -> None:
        self.cut = False


@dataclass
class SimulatedServer:
    """The server; an async context manager, or `run_in_thread()` outside an event loop."""

    default: Reply = field(default_factory=normal)
    host: str = "127.0.0.1"
    port: int = 0
    requests: list[ReceivedRequest] = field(default_factory=list)
    max_in_flight: int | None = None
    overload: Literal["cut", "503"] = "cut"
    overloaded: int = 0
    peak_in_flight: int = 0

    def __post_init__(self) -> None:
        self._active: set[_InFlight] = set()
        self._queue: collections.deque[Reply] = collections.deque()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (`http://127.0.0.1:<port>/v1`)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def request_count(self) -> int:
        """How many chat requests arrived (read fully) so far."""
        return len(self.requests)

    def script(self, *replies: Reply) -> None:
        """Queue replies for the next requests, in order."""
        self._queue.extend(replies)

    async def start(self) -> None:
        """Bind (port 0 picks a free port) and start accepting."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting and cut every open connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> SimulatedServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def run_in_thread(self) -> Callable[[], None]:
        """Serve from a daemon thread with its own loop; returns a function that stops it."""
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            started.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        thread = threading.Thread(target=run, name="trm-simulated-llm", daemon=True)
        thread.start()
        started.wait()

        def stop() -> None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()

        return stop

    def respond(self, body: Any) -> Reply:
        """The reply to one request (its JSON body): override it to answer per request.

        By default: the next scripted reply, else the scenario marked in the last user message,
        else `default`.
        """
        if self._queue:
            return self._queue.popleft()
        match = _MARKER.search(_last_user_text(body))
        if match and match.group(1) in SCENARIOS:
            return SCENARIOS[match.group(1)]()
        return self.default

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            # stop() cuts this connection. Ending normally keeps asyncio's stream callback
            # (which calls task.exception()) from logging the cancellation as an error.
            writer.transport.abort()
        finally:
            self._tasks.discard(task)
            writer.close()  # not awaited: a cancel arriving there would be logged the same way

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Serve one request; False when the connection must close."""
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        _, path, _ = request_line.split(" ", 2)
        headers = {}
        for line in header_lines:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        if not path.endswith("/chat/completions"):
            await _write(writer, status(404), keep_alive=True)
            return True
        body = json.loads(raw) if raw else None
        self.requests.append(ReceivedRequest(path, headers, body))
        reply = self.respond(body)
        keep_alive = headers.get("connection") != "close"
        full = self.max_in_flight is not None and len(self._active) >= self.max_in_flight
        if full and self.overload == "503":
            self.overloaded += 1
            await _write(writer, status(503), keep_alive=keep_alive)
            return keep_alive
        ticket = _InFlight()
        self._active.add(ticket)
        self.peak_in_flight = max(self.peak_in_flight, len(self._active))
        if full:
            for other in self._active:
                self.overloaded += not other.cut
                other.cut = True
        try:
            await _write(writer, reply, keep_alive=keep_alive, ticket=ticket)
        finally:
            self._active.discard(ticket)
        return reply.ending == "complete" and keep_alive and not ticket.cut


async def _write(
    writer: asyncio.StreamWriter,
    reply: Reply,
    *,
    keep_alive: bool,
    ticket: _InFlight | None = None,
) -> None:
    head = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}"]
    head += [f"{name}: {value}" for name, value in reply.headers]
    head += ["Transfer-Encoding: chunked", f"Connection: {'keep-alive' if keep_alive else 'close'}"]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
    for step in reply.steps:
        if ticket is not None and ticket.cut:  # overloaded: end mid-body, close the connection
            await writer.drain()
            return
        if isinstance(step, float | int):
            await writer.drain()
            await asyncio.sleep(step)
            if writer.transport.is_closing():  # the client gave up during the pause
                return
        elif step:
            writer.write(b"%x\r\n%s\r\n" % (len(step), step))
    if reply.ending == "reset":
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return
    if reply.ending == "complete":
        writer.write(b"0\r\n\r\n")
    await writer.drain()


def _last_user_text(body: Any) -> str:
    messages = body.get("messages") if isinstance(body, dict) else None
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def main(argv: Iterable[str] | None = None) -> None:
    """`python -m trm_llm.simulated_server [--port N] [--tokens N]`: serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=3, help="tokens in the default answer")
    args = parser.parse_args(list(argv) if argv is not None else None)

    async def serve() -> None:
        server = SimulatedServer(normal(["tok"] * args.tokens), port=args.port)
        async with server:
            print(server.base_url, flush=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
