"""Fresh event ids: time-ordered version-7 UUIDs in the normal form the log stores."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.store.helpers import added, in_a_forked_child
from trm_store import open_store
from trm_store.event_ids import check_event_id, new_event_id, new_event_ids


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


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 1_200), min_size=1, max_size=6))
def test_ids_drawn_for_appends_of_any_size_are_as_single_ones_and_all_distinct(
    counts: list[int],
) -> None:
    """Batches across the random pool's refills (400 ids a draw): each the size asked, every
    id a version-7 UUID in normal form whose random bits are its own."""
    batches = [new_event_ids(count) for count in counts]
    assert [len(batch) for batch in batches] == counts
    every = [event_id for batch in batches for event_id in batch]
    assert len(set(every)) == len(every)
    assert len({event_id[15:] for event_id in every}) == len(every)  # past the milliseconds
    for event_id in every:
        parsed = uuid.UUID(event_id)
        assert (parsed.version, parsed.variant, str(parsed)) == (7, uuid.RFC_4122, event_id)


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


def test_threads_drawing_at_once_never_draw_the_same_id() -> None:
    """Ids' random bits come from a pool shared by the threads (`_random_hex`), taken one id
    at a time and a whole append's at once."""
    drawn: list[list[str]] = [[] for _ in range(8)]

    def draw(mine: list[str]) -> None:
        for k in range(1_000):
            mine.extend(new_event_ids(k % 9) if k % 2 else [new_event_id()])

    threads = [threading.Thread(target=draw, args=(mine,)) for mine in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    every = [event_id for mine in drawn for event_id in mine]
    assert len(every) == 8 * (500 + 1_996) and len(set(every)) == len(every)


def test_a_forked_child_draws_other_random_bits_than_its_parent() -> None:
    """The parent's unused pool must not be drawn from in the child too: in the same
    millisecond both would write the same ids."""
    new_event_id()  # the pool is filled, most of it unused
    said = in_a_forked_child(lambda: ",".join(new_event_id() for _ in range(100)).encode())
    theirs = said.decode().split(",")
    ours = [new_event_id() for _ in range(100)]
    assert len(theirs) == 100
    assert not {i[15:] for i in theirs} & {i[15:] for i in ours}  # past the milliseconds


@settings(max_examples=30, deadline=None)
@given(given_ids=st.lists(st.booleans(), min_size=1, max_size=40))
def test_an_append_keeps_the_ids_given_and_draws_the_others(
    tmp_path_factory: pytest.TempPathFactory, given_ids: list[bool]
) -> None:
    """Whatever the mix (the preparer draws an append's ids at once only when the caller gave
    none): each given id is the recorded one, every other a fresh id of its own."""
    path = tmp_path_factory.mktemp("ids") / "trm.db"
    chosen = [str(uuid.uuid4()) if mine else None for mine in given_ids]
    with open_store(f"sqlite:///{path}", projections={}) as store:
        recorded = store.append("s", [added(k, event_id=c) for k, c in enumerate(chosen)])
    ids = [event.event_id for event in recorded]
    assert len(set(ids)) == len(ids)
    for event_id, c in zip(ids, chosen, strict=True):
        assert event_id == c if c is not None else uuid.UUID(event_id).version == 7
