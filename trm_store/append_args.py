"""The shapes of an append's arguments, checked before anything is validated or written: a
stream id no backend can store, an expected version that is none, anything but a non-empty list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trm_store.errors import EventValidationError
from trm_store.events import NewEvent
from trm_store.vocabulary import (
    ID_MAX,
    count_problem,
    exact_int,
    exact_text,
    id_problem,
    text_problem,
)

__all__ = ["STREAM_ID_MAX", "AppendItem", "check_items", "check_target", "non_empty_list"]

STREAM_ID_MAX = ID_MAX
AppendItem = tuple[str, Sequence[NewEvent], int | None]
"""(stream_id, events, expected_version) for `Store.append_batch`."""


def check_items(items: Sequence[AppendItem]) -> Sequence[AppendItem]:
    """Refuse anything but a non-empty list of (stream_id, events, expected_version)."""
    listed = non_empty_list(items, refused=(str, bytes))
    if listed is None:
        raise EventValidationError(
            "append_batch takes a non-empty list of (stream_id, events, expected_version)"
        )
    items = listed
    for item in items:
        if not isinstance(item, tuple) or len(item) != 3:
            raise EventValidationError(
                f"append item must be (stream_id, events, expected_version), got {item!r:.80}"
            )
    return items


def check_target(stream_id: object, expected_version: object) -> tuple[str, int | None]:
    """The stream id and expected_version to write, as plain `str` and `int` (`exact_text`:
    a subclass's `__ne__` could pass a moved stream's version check); refuse a stream id no
    backend can store and an expected_version that is not one.

    A stream id is an id (`trm_store.vocabulary.id_problem`) that may hold control characters,
    kept verbatim, but not what no backend stores (`text_problem`: NUL, or text that is not
    valid Unicode). An expected_version is None or a version both backends hold (0..INT64_MAX).
    """
    if type(stream_id) is not str:  # the usual stream id skips the call
        stream_id = exact_text(stream_id)
    problem = id_problem(stream_id, STREAM_ID_MAX, printable=False) or _text(stream_id)
    if problem is not None:
        raise EventValidationError(f"stream_id {problem}")
    if expected_version is not None and type(expected_version) is not int:
        expected_version = exact_int(expected_version)
    if expected_version is not None and (problem := count_problem(expected_version)):
        raise EventValidationError(f"expected_version must be None or a version: it {problem}")
    assert isinstance(stream_id, str)  # id_problem said so
    assert expected_version is None or isinstance(expected_version, int)
    return stream_id, expected_version


def _text(value: object) -> str | None:
    """`text_problem`, skipping the encode for plain ASCII (every stream id of every append)."""
    if isinstance(value, str) and value.isascii() and "\x00" not in value:
        return None
    return text_problem(value)


def non_empty_list(value: object, refused: tuple[type, ...] = ()) -> list[Any] | None:
    """`value` read once into a list, when it is a sequence that is none of `refused` (a list
    is recognised first: the usual) and that list is not empty; else None. The caller checks
    and writes that list: what is checked is what is written, whatever the sequence does on a
    second pass (or says its length is)."""
    if type(value) is not list and (isinstance(value, refused) or not isinstance(value, Sequence)):
        return None
    listed = list(value)
    return listed or None
