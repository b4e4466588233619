"""A throwaway `redis-server` on a free loopback port that a test may stop, freeze and restart.

Tests that fault Redis use one of these; the shared server on 6379 is never touched.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PrivateRedis", "free_port", "running_redis"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class PrivateRedis:
    """A `redis-server` (no persistence) owned by one test."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "notice",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # blocks until the server says it is ready (no sleeping)
            if "Ready to accept connections" in line:
                return
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def freeze(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel, nothing is answered."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)  # a frozen process must wake to die cleanly
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.proc = None


@contextmanager
def running_redis() -> Iterator[PrivateRedis]:
    """A started private server, killed on exit (for a fixture)."""
    server = PrivateRedis(free_port())
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None:
            server.kill()
