"""Event ids: drawing a fresh one, and normalising one a caller chose (a UUID either way)."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator

from trm_store.errors import EventValidationError

__all__ = ["check_event_id", "new_event_id"]


def new_event_id() -> str:
    """A fresh time-ordered (version 7, RFC 9562) UUID: 48 bits of Unix milliseconds, then 74
    random bits, in the normal form `str(uuid.UUID(...))` writes.

    Time-ordered so that the log's unique index on `event_id` grows at its end: with random
    (version 4) ids an append of 50 events dirtied up to 50 of that index's leaf pages, each
    written to the WAL and synced at commit (47 of the 64 pages an append wrote on SQLite, on a
    log of 10,000 events; more as the log grows), against about 5 now. Formatted from bytes
    directly: building a `uuid.UUID` costs three times as much, on every event appended without
    an id and every prediction a `RunLog` records. This costs ~9,600 instructions (callgrind)
    against the random id's ~7,600.
    """
    h = ((_now_ns() // 1_000_000).to_bytes(6) + _random10()).hex()
    return f"{h[:8]}-{h[8:12]}-7{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


_now_ns = time.time_ns
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}
"""The RFC 9562 variant: the top two bits of the 17th hex digit set to 10."""
_DRAWS = 400
"""Ids' random bytes taken from one `os.urandom` call."""
_pieces: Iterator[bytes] = iter(())


def _random10() -> bytes:
    """10 bytes from the OS's CSPRNG, drawn `_DRAWS` ids at a time.

    One `os.urandom` per id was a system call that releases the GIL, on every event appended:
    with other threads running Python, each return waited for the GIL (up to the 5 ms switch
    interval), and 4 threads appending got fewer events/s than one (bench/writers_bench.py).
    Thread-safe without a lock: `next` on a list iterator is one step under the GIL, so no two
    calls get the same piece; two threads that find it empty at once each draw a fresh list.
    """
    global _pieces
    try:
        return next(_pieces)
    except StopIteration:
        pool = os.urandom(10 * _DRAWS)
        pieces = [pool[k : k + 10] for k in range(10, len(pool), 10)]
        _pieces = iter(pieces)
        return pool[:10]


def _forget_pieces() -> None:
    """A forked child draws its own: the parent's unused pieces would give both the same ids."""
    global _pieces
    _pieces = iter(())


os.register_at_fork(after_in_child=_forget_pieces)


# A UUID already in its normal form (as `str(uuid4())` writes it): no need to parse it again.
_NORMAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def check_event_id(event_id: str) -> str:
    """Normalise a caller-provided event id (must be a UUID)."""
    if isinstance(event_id, str) and _NORMAL_UUID.fullmatch(event_id):
        return event_id
    try:
        return str(uuid.UUID(str(event_id)))
    except ValueError as e:
        raise EventValidationError(f"event_id {event_id!r} is not a UUID") from e
