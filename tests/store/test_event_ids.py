"""Fresh event ids: random version-4 UUIDs in the normal form the log stores."""

from __future__ import annotations

import uuid

from trm_store.event_ids import check_event_id, new_event_id


def test_new_event_ids_are_distinct_version_4_uuids_in_normal_form() -> None:
    ids = [new_event_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    for event_id in ids:
        parsed = uuid.UUID(event_id)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == event_id
        assert check_event_id(event_id) == event_id


def test_every_random_bit_of_a_new_event_id_varies() -> None:
    """122 bits are random: across many ids each of them is seen both set and clear."""
    fixed = (0xF << 76) | (0x3 << 62)  # the version nibble and the variant bits
    seen_set = seen_clear = 0
    for _ in range(2_000):
        value = uuid.UUID(new_event_id()).int
        seen_set |= value
        seen_clear |= ~value
    mask = (1 << 128) - 1
    assert seen_set & seen_clear & mask == mask & ~fixed
