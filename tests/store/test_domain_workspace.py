"""Workspace manifests (seed task 7): events + projection, and manifest.json written atomically."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trm_store import NewEvent, RunLog, open_store
from trm_store.domain._common import json_default
from trm_store.domain.errors import (
    ManifestExportError,
    UnknownWorkspaceError,
    WorkspaceExistsError,
)
from trm_store.domain.manifest_file import export_manifest
from trm_store.domain.workspace import (
    get_manifest,
    record_run,
    scaffold_workspace,
    update_best,
    update_manifest,
)

ROOT = Path(__file__).resolve().parents[2]


def _as_json(manifest: dict[str, Any]) -> Any:
    """The manifest as its JSON file holds it (times as ISO 8601)."""
    return json.loads(json.dumps(manifest, default=json_default))


WORKER = (sys.executable, "-m", "tests.store.domain_workers")


def test_the_manifest_is_the_fold_of_the_workspace_events(store_url: str) -> None:
    with open_store(store_url) as store:
        scaffold_workspace(store, "ws", skills="skills/v1", prompts="prompts/v1", seed=7)
        update_manifest(store, "ws", skills="skills/v2", note="slow update")
        for run_id in ("r1", "r2"):
            with RunLog(store, run_id):
                pass
        record_run(store, "ws", "r1", epoch=1)
        record_run(store, "ws", "r2", epoch=2)
        record_run(store, "ws", "r1", status="completed")
        update_best(store, "ws", run_id="r2", hard_acc=0.71)
        update_best(store, "ws", run_id="r1", hard_acc=0.74)

        manifest = get_manifest(store, "ws")
        events = store.read_stream("workspace:ws")

    assert [e.type for e in events] == [
        "workspace.scaffolded",
        "workspace.manifest_updated",
        "workspace.run_recorded",
        "workspace.run_recorded",
        "workspace.run_recorded",
        "workspace.best_updated",
        "workspace.best_updated",
    ]
    assert manifest["workspace_id"] == "ws"
    assert (manifest["skills"], manifest["prompts"]) == ("skills/v2", "prompts/v1")
    assert (manifest["seed"], manifest["note"]) == (7, "slow update")
    assert [(r["run_id"], r.get("epoch"), r.get("status")) for r in manifest["runs"]] == [
        ("r1", 1, "completed"),
        ("r2", 2, None),
    ]
    assert manifest["best"] == {"run_id": "r1", "hard_acc": 0.74}
    assert manifest["version"] == 7
    assert manifest["created_at"] == events[0].recorded_at
    assert manifest["updated_at"] == events[-1].recorded_at


def test_scaffolding_twice_or_changing_an_unknown_workspace_is_refused(store_url: str) -> None:
    with open_store(store_url) as store:
        scaffold_workspace(store, "ws", skills="s", prompts="p")
        head = store.head_position()
        with pytest.raises(WorkspaceExistsError):
            scaffold_workspace(store, "ws", skills="s2", prompts="p2")
        again = NewEvent("workspace.scaffolded", {"skills": "s2", "prompts": "p2", "fields": {}})
        with pytest.raises(WorkspaceExistsError):  # refused by the read model, inline
            store.append("workspace:ws", [again])
        for change in (
            lambda: update_manifest(store, "nope", skills="s"),
            lambda: record_run(store, "nope", "r1"),
            lambda: update_best(store, "nope", run_id="r1"),
            lambda: get_manifest(store, "nope"),
        ):
            with pytest.raises(UnknownWorkspaceError):
                change()
        assert store.head_position() == head
        assert get_manifest(store, "ws")["skills"] == "s"


def test_export_writes_the_manifest_as_json(sqlite_url: str, tmp_path: Path) -> None:
    with open_store(sqlite_url) as store:
        scaffold_workspace(store, "ws", skills="s", prompts="p")
        written = export_manifest(store, "ws", tmp_path)
        assert written == tmp_path / "manifest.json"
        assert json.loads(written.read_text(encoding="utf-8")) == _as_json(
            get_manifest(store, "ws")
        )
        other = export_manifest(store, "ws", tmp_path / "copy.json")
        assert other.read_bytes() == written.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".tmp") == []


def test_a_crash_at_the_rename_leaves_the_previous_manifest_intact(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed task 7: with os.replace failing, manifest.json is byte-for-byte the previous one."""
    directory = tmp_path / "ws"
    directory.mkdir()
    with open_store(store_url) as store:
        scaffold_workspace(store, "ws", skills="skills/v1", prompts="prompts/v1")
        target = export_manifest(store, "ws", directory)
        before = target.read_bytes()
        update_manifest(store, "ws", skills="skills/v2")

        def crash(src: object, dst: object) -> None:
            raise OSError("crash during replace")

        monkeypatch.setattr(os, "replace", crash)
        with pytest.raises(ManifestExportError, match="crash during replace"):
            export_manifest(store, "ws", directory)
        monkeypatch.undo()

        assert target.read_bytes() == before
        assert json.loads(before)["skills"] == "skills/v1"
        assert [p.name for p in directory.iterdir()] == ["manifest.json"]  # temp file removed
        assert get_manifest(store, "ws")["skills"] == "skills/v2"  # the log is the truth


def _signature(directory: Path, target: Path) -> tuple[object, ...]:
    """What changes when an export starts (a temp file appears) or lands (the file changes)."""
    stat = target.stat()
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, sorted(os.listdir(directory)))


def _kill_mid_export(
    child: subprocess.Popen[str], directory: Path, target: Path, spins: int
) -> None:
    """SIGKILL the child while it is writing: as soon as the directory shows an export under way,
    after `spins` more looks (so the moment within the write varies)."""
    assert child.stdout is not None
    assert child.stdout.readline(), "the child never finished its first export"
    start, deadline = _signature(directory, target), time.monotonic() + 30
    while _signature(directory, target) == start and time.monotonic() < deadline:
        pass
    for _ in range(spins):
        _signature(directory, target)
    child.send_signal(signal.SIGKILL)
    child.communicate()
    assert child.returncode == -signal.SIGKILL


def test_sigkill_during_a_stream_of_exports_never_leaves_a_partial_file(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A real child exports two large manifests to one file in turn and is SIGKILLed at random
    moments inside a write: the file is always one of the two manifests, complete."""
    out = tmp_path / "out"
    out.mkdir()
    with open_store(sqlite_url) as store:
        for name, fill in (("big-a", "a"), ("big-b", "b")):
            scaffold_workspace(store, name, skills="s", prompts="p", blob=fill * 2_000_000)
        complete = {name: _as_json(get_manifest(store, name)) for name in ("big-a", "big-b")}
    target = out / "manifest.json"
    rng = random.Random(20261129)
    for _round in range(6):
        child = subprocess.Popen(
            [*WORKER, "export", sqlite_url, str(target), "big-a", "big-b"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _kill_mid_export(child, out, target, spins=rng.randint(0, 300))

        manifest = json.loads(target.read_text(encoding="utf-8"))  # never partial
        assert manifest == complete[manifest["workspace_id"]]
        strays = [p.name for p in out.iterdir() if p.name != "manifest.json"]
        assert all(s.startswith(".manifest.json.") and s.endswith(".tmp") for s in strays)
