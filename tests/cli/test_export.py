"""`trm export`, `trm_store.frames`, `trm manifest` and `trm predictions` on a store filled by
`trm demo` (the session's `demo_store`) plus a run of hostile values: every table in every
format reads back with its values and types, the store is never written, and bad requests are
one line and exit 2."""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.cli.helpers import trm
from tests.demo_store import HOSTILE, HOSTILE_RUN, DemoStore
from trm_store import RunLog, open_store
from trm_store.domain._common import json_default
from trm_store.domain.tables import EXPORT_TABLES, table_rows


def _as_json(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = json.loads(json.dumps(rows, default=json_default))
    return loaded


@pytest.mark.parametrize("table", list(EXPORT_TABLES))
def test_jsonl_is_every_row_of_the_table(demo_store: DemoStore, table: str) -> None:
    url, folder = demo_store.url, demo_store.folder
    with open_store(url, read_only=True) as store:
        rows = table_rows(store, table)
        head = store.head_position()
    done = trm("export", table, "--db", url, "--format", "jsonl", cwd=folder)
    assert done.returncode == 0, done.stderr
    exported = [json.loads(line) for line in done.stdout.splitlines()]
    assert exported == _as_json(rows) and len(rows) > 0
    with open_store(url, read_only=True) as store:
        assert store.head_position() == head  # nothing written


@pytest.mark.parametrize("table", list(EXPORT_TABLES))
def test_csv_has_one_line_per_row_and_every_column(
    demo_store: DemoStore, table: str, tmp_path: Path
) -> None:
    url, folder = demo_store.url, demo_store.folder
    out = tmp_path / f"{table}.csv"
    done = trm("export", table, "--db", url, "--out", str(out), cwd=folder)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stderr
    with open_store(url, read_only=True) as store:
        rows = table_rows(store, table)
    read = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert len(read) == len(rows)
    assert set(read[0]) == {key for row in rows for key in row}
    for got, row in zip(read, rows, strict=True):
        for key, value in row.items():
            if isinstance(value, bool | dict | list):
                assert json.loads(got[key]) == value
            elif isinstance(value, datetime):
                assert datetime.fromisoformat(got[key]) == value
            elif value is None:
                assert got[key] == ""
            else:
                assert got[key] == str(value)


def test_frames_keep_types(demo_store: DemoStore) -> None:
    pd = pytest.importorskip("pandas")
    from trm_store import frames

    url = demo_store.url
    with open_store(url, read_only=True) as store:
        predictions = frames.predictions(store)
        runs = frames.runs(store)
        metrics = frames.dual_metrics(store)
        gates = frames.gates(store)
        rows = table_rows(store, "predictions")
    assert str(predictions["correct"].dtype) == "boolean"
    assert predictions["correct"].isna().sum() == sum(r["correct"] is None for r in rows)
    assert isinstance(runs["started_at"].dtype, pd.DatetimeTZDtype)
    assert str(runs["started_at"].dt.tz) == "UTC"
    assert str(runs["predictions"].dtype) == "Int64"
    assert str(metrics["hard_acc"].dtype) == "Float64"
    assert isinstance(gates["config"].iloc[0], dict)
    hostile = predictions[predictions["run_id"] == HOSTILE_RUN]
    assert list(hostile["prediction"].iloc[: len(HOSTILE)]) == HOSTILE


@pytest.mark.parametrize("table", ["predictions", "gate_blocks", "llm_calls"])
def test_parquet_reads_back(demo_store: DemoStore, table: str, tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    url, folder = demo_store.url, demo_store.folder
    out = tmp_path / f"{table}.parquet"
    done = trm("export", table, "--db", url, "--format", "parquet", "--out", str(out), cwd=folder)
    assert done.returncode == 0, done.stderr
    back = pd.read_parquet(out)
    with open_store(url, read_only=True) as store:
        rows = table_rows(store, table)
    assert len(back) == len(rows)
    if table == "predictions":
        assert str(back["correct"].dtype) == "boolean"
    assert oct(out.stat().st_mode & 0o777) != oct(0o600)  # as open() creates files


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("export", "gates", "--format", "parquet"), "needs --out"),
        (("export", "gates", "--out", "/nonexistent-dir/x.csv"), "cannot write"),
        (("export", "nope"), "invalid choice"),
        (("manifest", "nope"), "UnknownWorkspaceError"),
        (("predictions", "nope"), "UnknownRunError"),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(
    demo_store: DemoStore, args: tuple[str, ...], message: str
) -> None:
    url, folder = demo_store.url, demo_store.folder
    done = trm(*args, "--db", url, cwd=folder)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not list(Path("/").glob("nonexistent-dir"))


def test_manifest_json_is_get_manifest(demo_store: DemoStore) -> None:
    url, folder = demo_store.url, demo_store.folder
    done = trm("manifest", "trm-demo", "--db", url, "--json", cwd=folder)
    assert done.returncode == 0, done.stderr
    from trm_store import get_manifest

    with open_store(url, read_only=True) as store:
        assert json.loads(done.stdout) == _as_json([get_manifest(store, "trm-demo")])[0]
    table = trm("manifest", "trm-demo", "--db", url, cwd=folder)
    assert table.returncode == 0 and "best" in table.stdout


def test_predictions_show_hostile_strings_as_text(demo_store: DemoStore) -> None:
    url, folder = demo_store.url, demo_store.folder
    done = trm("predictions", HOSTILE_RUN, "--db", url, cwd=folder)
    assert done.returncode == 0, done.stderr
    assert "[bold red]x[/]" in done.stdout and "<script>" in done.stdout
    assert "accuracy 0.600 (3/5 judged), 1 INFRA" in done.stdout
    as_json = json.loads(trm("predictions", HOSTILE_RUN, "--db", url, "--json", cwd=folder).stdout)
    assert (as_json["judged"], as_json["correct"], as_json["infra"]) == (5, 3, 1)
    assert [r["prediction"] for r in as_json["rows"]][: len(HOSTILE)] == HOSTILE


def test_out_through_a_symlink_or_into_a_fifo_keeps_what_is_there(
    sqlite_url: str, tmp_path: Path
) -> None:
    """--out was written to a temporary file renamed over it: a symlink became a regular file and
    a FIFO or a device was replaced (as root, `--out /dev/full` replaced /dev/full, and said
    `wrote`). A symlink now keeps pointing at the file it names; a FIFO is written in place."""
    with open_store(sqlite_url) as store, RunLog(store, "r-export"):
        pass
    real, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    link.symlink_to(real)
    args = ("export", "runs", "--db", sqlite_url, "--format", "jsonl", "--out")
    done = trm(*args, str(link), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and json.loads(real.read_text())["run_id"] == "r-export"

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    done = trm(*args, str(fifo), cwd=tmp_path)
    reader.join(20)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode), "the FIFO was replaced by a file"
    assert got and json.loads(got[0])["run_id"] == "r-export"
