"""`import trm_store` and its vocabulary leaf load no database library: names load on first use."""

from __future__ import annotations

import pytest

import trm_store
from tests.light_imports import heavy_modules_loaded


@pytest.mark.parametrize("statement", ["import trm_store", "import trm_store.vocabulary"])
def test_import_loads_no_database_library(statement: str) -> None:
    assert heavy_modules_loaded(statement) == []


def test_every_public_name_resolves_to_its_defining_module() -> None:
    for name in trm_store.__all__:
        value = getattr(trm_store, name)
        assert getattr(value, "__module__", trm_store._EXPORTS[name]).startswith("trm_store"), name


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = trm_store.no_such_name  # type: ignore[attr-defined]
