"""The child-process sink's wire: length-prefixed frames over a stream socket.

Both ends of `trm_llm.sink_process` speak it, the writer thread with blocking calls and an event
loop with `async` ones, over a non-blocking socket. Waits use `poll`, not `select`: a busy
client's descriptors often pass 1023, which `select` refuses.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import time

__all__ = ["arecv_frame", "asend_frame", "ready", "recv_frame", "send_frame"]

_HEADER = struct.Struct("!Q")  # a frame: its length, then its bytes


def ready(sock: socket.socket, event: int, timeout_s: float | None) -> bool:
    """Whether `sock` is ready for `event` (select.POLLIN, POLLOUT) within `timeout_s` (None:
    no limit). `poll`, not `select`: a descriptor above 1023 is common in a busy client."""
    poller = select.poll()
    poller.register(sock, event)
    return bool(poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000))))


def send_frame(sock: socket.socket, payload: bytes) -> None:
    """One frame, whole (blocking until sent, whatever the socket's mode)."""
    data = memoryview(_HEADER.pack(len(payload)) + payload)
    while data:
        try:
            data = data[sock.send(data) :]
        except BlockingIOError:
            ready(sock, select.POLLOUT, None)


def recv_frame(sock: socket.socket, timeout_s: float | None = None) -> bytes:
    """One frame (EOFError at the end of the stream, TimeoutError past `timeout_s`)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    (size,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size, deadline))
    return _recv_exactly(sock, size, deadline)


def _recv_exactly(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("no answer in time")
        if not ready(sock, select.POLLIN, left):
            continue
        try:
            n = sock.recv_into(view[got:])
        except BlockingIOError:
            continue
        if n == 0:
            raise EOFError("the socket was closed")
        got += n
    return bytes(buffer)


async def asend_frame(sock: socket.socket, payload: bytes) -> None:
    """`send_frame` on an event loop."""
    await asyncio.get_running_loop().sock_sendall(sock, _HEADER.pack(len(payload)) + payload)


async def arecv_frame(sock: socket.socket) -> bytes:
    """`recv_frame` on an event loop (the loop's own waits; no timeout of its own)."""
    loop = asyncio.get_running_loop()

    async def exactly(size: int) -> bytes:
        buffer = bytearray(size)
        view, got = memoryview(buffer), 0
        while got < size:
            n = await loop.sock_recv_into(sock, view[got:])
            if n == 0:
                raise EOFError("the socket was closed")
            got += n
        return bytes(buffer)

    (size,) = _HEADER.unpack(await exactly(_HEADER.size))
    return await exactly(size)
