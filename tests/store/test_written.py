"""`Written`: an append as written, its recorded events built by whoever asks first."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import trm_store.written
from tests.store.helpers import noted
from trm_store.prepare import AppendPreparer
from trm_store.written import Written


def test_an_interrupt_part_way_through_the_build_leaves_the_events_unbuilt_not_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal handler's exception raised while the events are built: the next call builds
    them all, where a list filled in place would have been returned short."""
    prepared = AppendPreparer({"host": "h", "pid": 1})(("s", [noted(n) for n in range(3)], None))
    written = Written([prepared], [(7, 1)], datetime.now(UTC))
    build = trm_store.written.recorded_event
    calls = 0

    def interrupted_at_the_second(*fields: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt
        return build(*fields)

    monkeypatch.setattr(trm_store.written, "recorded_event", interrupted_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        written.events()
    events = written.events()
    assert [(e.position, e.version) for e in events] == [(7, 1), (8, 2), (9, 3)]
    assert written.events() is events
