"""Event ids: drawing a fresh one, and normalising one a caller chose (a UUID either way)."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator
from itertools import islice

from trm_store.errors import EventValidationError

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
    return _time_part() + _one_tail()


def new_event_ids(count: int) -> list[str]:
    """`count` fresh ids (`new_event_id`), for the events of one append: they share the clock's
    read and its formatting, and their random parts are taken from the pool at once, each
    joined to the time in C (`map`)."""
    if count == 1:
        return [new_event_id()]
    return list(map(_time_part().__add__, _random_tails(count)))


def _time_part() -> str:
    """An id's first 15 characters, dashes included: the milliseconds, then the version."""
    millis = (_now_ns() // 1_000_000).to_bytes(6).hex()
    return f"{millis[:8]}-{millis[8:]}-7"


_now_ns = time.time_ns
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}
"""The RFC 9562 variant: the top two bits of the 17th hex digit set to 10."""
_DRAWS = 400
"""Ids' random parts made from one `os.urandom` call (more when one draw asks for more)."""
_tails: Iterator[str] = iter(())


def _random_tails(count: int) -> list[str]:
    """`count` ids' random parts (the id after `_time_part`: 3, 4 and 12 hex digits, the
    variant in the second group) from the OS's CSPRNG, made `_DRAWS` (or `count`, when more)
    at a time, 80 random bits each, of which 74 are kept.

    One `os.urandom` per id was a system call that releases the GIL, on every event appended:
    with other threads running Python, each return waited for the GIL (up to the 5 ms switch
    interval), and 4 threads appending got fewer events/s than one (bench/writers_bench.py).
    Formatted as they are made, in one comprehension, not id by id (a Python call an event).
    Thread-safe without a lock: each part is taken by one `next` on a list iterator, one step
    under the GIL, so no two calls get the same one; two threads that find it empty at once
    each make a fresh list.
    """
    global _tails
    taken = list(islice(_tails, count))
    if len(taken) < count:
        pool = os.urandom(10 * max(_DRAWS, count)).hex()
        tails = iter(
            [
                f"{pool[k + 1 : k + 4]}-{_VARIANT[pool[k + 4]]}{pool[k + 5 : k + 8]}-"
                f"{pool[k + 8 : k + 20]}"
                for k in range(0, len(pool), 20)
            ]
        )
        taken.extend(islice(tails, count - len(taken)))
        _tails = tails
    return taken


def _one_tail() -> str:
    """`_random_tails(1)`'s part, without its list: one step of the iterator, most of the
    time."""
    try:
        return next(_tails)
    except StopIteration:
        return _random_tails(1)[0]


def _forget_tails() -> None:
    """A forked child draws its own: the parent's unused parts would give both the same ids."""
    global _tails
    _tails = iter(())


os.register_at_fork(after_in_child=_forget_tails)


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
