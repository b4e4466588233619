"""Event ids: drawing a fresh one, and normalising one a caller chose (a UUID either way)."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator
from itertools import islice

from trm_store.errors import EventValidationError
from trm_store.vocabulary import exact_text

__all__ = ["check_event_id", "new_event_id", "new_event_ids"]


def new_event_id() -> str:
    """A fresh time-ordered (version 7, RFC 9562) UUID: 48 bits of Unix milliseconds, then 74
    random bits, in the normal form `str(uuid.UUID(...))` writes.

    Time-ordered so that the log's unique index on `event_id` grows at its end: with random
    (version 4) ids an append of 50 events dirtied up to 50 of that index's leaf pages, each
    written to the WAL and synced at commit (47 of the 64 pages an append wrote on SQLite, on a
    log of 10,000 events; more as the log grows), against about 5 now. Formatted from hex text
    directly: building a `uuid.UUID` costs three times as much, on every event appended without
    an id and every prediction a `RunLog` records.
    """
    return _formatted(_time_part(), _one_piece())


def new_event_ids(count: int) -> list[str]:
    """`count` fresh ids (`new_event_id`), for the events of one append: they share the clock's
    read and its formatting, and take their random bits from the pool at once (callgrind:
    ~5,800 instructions an id drawn 50 at a time, ~11,000 one at a time)."""
    if count == 1:
        return [new_event_id()]
    time_part = _time_part()
    return [_formatted(time_part, piece) for piece in _random_hex(count)]


def _time_part() -> str:
    """An id's first 13 hex digits, dashes included: the milliseconds, then the version."""
    millis = (_now_ns() // 1_000_000).to_bytes(6).hex()
    return f"{millis[:8]}-{millis[8:]}-7"


def _formatted(time_part: str, piece: str) -> str:
    """The id of `time_part` and 20 random hex digits: the first makes way for the version
    (in `time_part`), the fifth carries the variant."""
    return f"{time_part}{piece[1:4]}-{_VARIANT[piece[4]]}{piece[5:8]}-{piece[8:]}"


_now_ns = time.time_ns
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}
"""The RFC 9562 variant: the top two bits of the 17th hex digit set to 10."""
_DRAWS = 400
"""Ids' random bits taken from one `os.urandom` call (more when one draw asks for more)."""
_pieces: Iterator[str] = iter(())


def _random_hex(count: int) -> list[str]:
    """`count` pieces of 20 random hex digits (80 bits) from the OS's CSPRNG, drawn `_DRAWS` (or
    `count`, when more) at a time.

    One `os.urandom` per id was a system call that releases the GIL, on every event appended:
    with other threads running Python, each return waited for the GIL (up to the 5 ms switch
    interval), and 4 threads appending got fewer events/s than one (bench/writers_bench.py).
    Thread-safe without a lock: each piece is taken by one `next` on a list iterator, one step
    under the GIL, so no two calls get the same piece; two threads that find it empty at once
    each draw a fresh list.
    """
    global _pieces
    taken = list(islice(_pieces, count))
    if len(taken) < count:
        pool = os.urandom(10 * max(_DRAWS, count)).hex()
        pieces = iter([pool[k : k + 20] for k in range(0, len(pool), 20)])
        taken.extend(islice(pieces, count - len(taken)))
        _pieces = pieces
    return taken


def _one_piece() -> str:
    """`_random_hex(1)`'s piece, without its list: one step of the iterator, most of the time."""
    try:
        return next(_pieces)
    except StopIteration:
        return _random_hex(1)[0]


def _forget_pieces() -> None:
    """A forked child draws its own: the parent's unused pieces would give both the same ids."""
    global _pieces
    _pieces = iter(())


os.register_at_fork(after_in_child=_forget_pieces)


# A UUID already in its normal form (as `str(uuid4())` writes it): no need to parse it again.
_NORMAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def check_event_id(event_id: str) -> str:
    """Normalise a caller-provided event id (must be a UUID), as a plain `str`."""
    event_id = exact_text(event_id)
    if isinstance(event_id, str) and _NORMAL_UUID.fullmatch(event_id):
        return event_id
    try:
        return str(uuid.UUID(str(event_id)))
    except ValueError as e:
        raise EventValidationError(f"event_id {event_id!r} is not a UUID") from e
