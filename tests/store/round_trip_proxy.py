"""A loopback TCP proxy in front of PostgreSQL that counts round trips and connections.

A round trip is counted each time a client sends after the server has answered: the client had
to wait for that answer. Pipelined statements sent at once count one, like the network sees them.
It can also forget its open flows, as a NAT or a load balancer does after an idle timeout: the
next packet a client sends on one is answered with a reset, and nothing reaches the server. Or
go silent (`silent`): nothing forwarded either way, no reset, both sockets left open, as a path
that stopped forwarding looks from either end.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from urllib.parse import urlsplit, urlunsplit


class RoundTripProxy:
    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self.round_trips = 0
        self.connections = 0
        self.open_connections = 0
        self._flows: list[list[bool]] = []
        """Each connection's `forgotten` flag."""
        self.silent = threading.Event()
        self.silent_at: bytes | None = None
        """Go silent when a client sends these bytes (a statement's text), before they pass."""
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, url: str) -> str:
        """`url` with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        netloc[-1] = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc="@".join(netloc)))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._target_port))
            answered = [True]  # the client speaks first
            forgotten = [False]
            with self._lock:
                self.connections += 1
                self.open_connections += 1
                self._flows.append(forgotten)
            threading.Thread(
                target=self._pump, args=(client, server, answered, True, forgotten), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(server, client, answered, False, forgotten), daemon=True
            ).start()

    def forget_flows(self) -> None:
        """Forget every open connection: silently, as a NAT does (no FIN to either side)."""
        with self._lock:
            for forgotten in self._flows:
                forgotten[0] = True

    def _pump(
        self,
        source: socket.socket,
        sink: socket.socket,
        answered: list[bool],
        from_client: bool,
        forgotten: list[bool],
    ) -> None:
        try:
            while data := source.recv(65536):
                if from_client and self.silent_at is not None and self.silent_at in data:
                    self.silent.set()
                while self.silent.is_set():  # held, not forwarded, nothing said
                    time.sleep(0.05)
                if forgotten[0]:  # a reset to whoever sends, nothing forwarded
                    source.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    break
                with self._lock:
                    if from_client and answered[0]:
                        self.round_trips += 1
                    answered[0] = not from_client
                sink.sendall(data)
        except OSError:
            pass
        finally:
            if from_client:
                with self._lock:
                    self.open_connections -= 1
            for s in (source, sink):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            source.close()

    def close(self) -> None:
        self._listener.close()


@contextmanager
def round_trip_proxy(url: str) -> Iterator[tuple[RoundTripProxy, str]]:
    """A proxy in front of the server of `url`, and `url` through it."""
    proxy = RoundTripProxy(urlsplit(url).port or 5432)
    try:
        yield proxy, proxy.url(url)
    finally:
        proxy.close()
