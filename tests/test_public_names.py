"""The public API is exactly what `__all__` says, and every name in it exists."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("package", ["trm_store", "trm_llm", "trm_gate"])
def test_all_names_exist(package: str) -> None:
    module = importlib.import_module(package)
    exported = getattr(module, "__all__", None)
    assert exported, f"{package} has no __all__"
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == []


def test_store_exports_the_spec_names() -> None:
    import trm_store

    spec = {
        "open_store",
        "NewEvent",
        "RecordedEvent",
        "Store",
        "register_event_type",
        "StoreError",
        "ConcurrencyError",
        "ReadOnlyStoreError",
        "SchemaVersionError",
        "EventValidationError",
        "StaleProjectionError",
    }
    assert spec <= set(trm_store.__all__)
