"""The PostgreSQL append lock is per store (per schema): a writer holding one store's lock
holds up that store's writers only, never a store in another schema of the same database."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.conftest import _pg_schema_url
from tests.store import helpers  # noqa: F401  (registers test.added)
from trm_store import NewEvent, open_store

pytestmark = pytest.mark.postgres


@pytest.fixture
def two_urls() -> Iterator[tuple[str, str]]:
    first, second = _pg_schema_url(), _pg_schema_url()
    try:
        yield next(first), next(second)
    finally:
        for generator in (first, second):
            next(generator, None)  # drops its schema


def _append_in_thread(url: str, stream: str) -> tuple[threading.Thread, list[float]]:
    took: list[float] = []

    def append() -> None:
        with open_store(url) as store:
            started = time.monotonic()
            store.append(stream, [NewEvent("test.added", {"amount": 1})])
            took.append(time.monotonic() - started)

    thread = threading.Thread(target=append, daemon=True)
    thread.start()
    return thread, took


def test_a_held_lock_holds_up_its_own_store_only(two_urls: tuple[str, str]) -> None:
    url_a, url_b = two_urls
    with open_store(url_a) as a, open_store(url_b):
        with a.write_transaction():  # store A's append lock, held
            other, other_took = _append_in_thread(url_b, "b-1")
            other.join(20)
            assert other_took, "an append to another schema's store waited for this lock"
            same, same_took = _append_in_thread(url_a, "a-1")
            same.join(1.0)
            assert not same_took, "an append to the same store did not wait for its lock"
        same.join(20)
        assert same_took and a.stream_version("a-1") == 1
