"""Timestamps have one shape (issue 14.11): every time the public read API returns is an aware UTC
`datetime` (never an ISO string), on both backends; JSON output (`export_manifest`, `trm runs
--json`) writes them as ISO 8601 with the offset."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.cli.helpers import trm
from trm_store import (
    RunLog,
    export_manifest,
    get_manifest,
    list_runs,
    open_store,
    read_diagnoses,
    read_dual_metric,
    record_diagnosis,
    record_run,
    run_info,
    scaffold_workspace,
    update_best,
    write_dual_metric,
)


def _times(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every value under a key ending in `_at`, with its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            if str(key).endswith("_at"):
                yield f"{path}.{key}", item
            yield from _times(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _times(item, f"{path}[{i}]")


def _record(url: str) -> None:
    with open_store(url) as store:
        scaffold_workspace(store, "ws", skills="s", prompts="p")
        with RunLog(store, "r") as log:
            log.record_prediction(
                "q", unit_id="u", prediction="A", correct=True, stop_reason="stop"
            )
        RunLog(store, "live").__enter__()
        record_run(store, "ws", "r", epoch=1)
        update_best(store, "ws", run_id="r")
        write_dual_metric(
            store,
            run_id="r",
            epoch=1,
            version_kind="final",
            skills_version="s",
            prompts_version="p",
            pool="val",
            hard_acc=1.0,
        )
        record_diagnosis(store, run_id="r", question_id="q", tier="T1")


def test_the_read_api_gives_aware_utc_datetimes(store_url: str) -> None:
    _record(store_url)
    with open_store(store_url, read_only=True) as store:
        answers = {
            "run_info": [run_info(store, "r"), run_info(store, "live")],
            "list_runs": list_runs(store, now=datetime.now(UTC)),
            "read_dual_metric": read_dual_metric(store, run_id="r"),
            "get_manifest": get_manifest(store, "ws"),
            "read_diagnoses": read_diagnoses(store, "r"),
        }
    times = list(_times(answers))
    assert len(times) >= 12
    for where, value in times:
        if value is None:
            continue
        assert isinstance(value, datetime), (where, value)
        assert value.utcoffset() == timedelta(0), (where, value)
        assert value.tzinfo is UTC, (where, value)


def test_json_output_writes_them_as_iso_8601(store_url: str, tmp_path: Path) -> None:
    _record(store_url)
    with open_store(store_url, read_only=True) as store:
        manifest = get_manifest(store, "ws")
        written = json.loads(export_manifest(store, "ws", tmp_path).read_text())
    listed = json.loads(trm("runs", "--db", store_url, "--json", cwd=tmp_path).stdout)
    times = list(_times(written)) + list(_times(listed))
    assert len(times) >= 8
    for where, value in times:
        if value is None:
            continue
        parsed = datetime.fromisoformat(value)
        assert parsed.utcoffset() == timedelta(0), (where, value)
    assert datetime.fromisoformat(written["created_at"]) == manifest["created_at"]
