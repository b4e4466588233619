"""The log's own tests run on a store with the test projection only (`TOTALS`); the domain test
modules define their own `store`, with the domain projections."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.store.helpers import TOTALS
from trm_store import Store, open_store


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url, projections=TOTALS) as s:
        yield s
