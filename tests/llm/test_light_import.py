"""`import trm_llm` loads no database library: the store sink imports the store lazily."""

from __future__ import annotations

from tests.light_imports import heavy_modules_loaded


def test_import_trm_llm_loads_no_database_library() -> None:
    assert heavy_modules_loaded("import trm_llm") == []
