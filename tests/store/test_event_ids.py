"""Fresh event ids: time-ordered version-7 UUIDs in the normal form the log stores."""

from __future__ import annotations

import time
import uuid

from trm_store.event_ids import check_event_id, new_event_id


def test_new_event_ids_are_distinct_version_7_uuids_in_normal_form() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_event_id() for _ in range(20_000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for event_id in ids:
        parsed = uuid.UUID(event_id)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == event_id
        assert check_event_id(event_id) == event_id
        assert before <= parsed.int >> 80 <= after  # its first 48 bits: Unix milliseconds


def test_ids_drawn_a_millisecond_apart_sort_in_drawing_order() -> None:
    """What they are time-ordered for: the unique index on event_id grows at its end."""
    earlier = new_event_id()
    time.sleep(0.002)
    assert earlier < new_event_id()


def test_every_random_bit_of_a_new_event_id_varies() -> None:
    """74 bits are random: across many ids each of them is seen both set and clear."""
    random_bits = ((1 << 12) - 1) << 64 | ((1 << 62) - 1)  # rand_a and rand_b (RFC 9562)
    seen_set = seen_clear = 0
    for _ in range(2_000):
        value = uuid.UUID(new_event_id()).int
        seen_set |= value
        seen_clear |= ~value
    assert seen_set & seen_clear & random_bits == random_bits
