"""`manifest.json` as a derived view of the workspace projection, written atomically.

The file is never the source of truth (the log is), but harnesses and people read it, so a crash
must never leave it half-written: the new content goes to a temporary file in the same directory,
is fsynced, replaces the old file with `os.replace` (atomic on POSIX), and the directory is fsynced
so the rename itself survives a power loss. A crash before the rename leaves the previous file
untouched, plus at most a stray `.manifest.json.*.tmp` next to it (safe to delete).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trm_store.domain._common import json_default
from trm_store.domain.errors import DomainInputError, ManifestExportError
from trm_store.domain.workspace import get_manifest

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["MANIFEST_NAME", "atomic_write_json", "export_manifest"]

MANIFEST_NAME = "manifest.json"
_NEW_FILE_MODE = 0o644


def export_manifest(store: Store, workspace_id: str, path: str | os.PathLike[str]) -> Path:
    """Write the workspace's manifest to `path` atomically and return the file written.

    `path` is the file to write, or an existing directory to write `manifest.json` into. A path
    that cannot be written (its directory missing, no permission, a full disk) raises
    ManifestExportError, with the previous file, if any, untouched.
    """
    manifest = get_manifest(store, workspace_id)
    try:
        target = Path(path)
    except TypeError as e:
        raise DomainInputError(f"path must be a str or os.PathLike, got {path!r:.80}") from e
    if target.is_dir():
        target = target / MANIFEST_NAME
    if not target.parent.is_dir():
        raise ManifestExportError(
            f"cannot write {target}: directory {target.parent} does not exist"
        )
    if target.exists() and not target.is_file():  # renamed over, a FIFO or device would go
        raise ManifestExportError(f"cannot write {target}: it is not a regular file")
    try:
        atomic_write_json(target.resolve(), manifest)  # a symlink keeps naming its file
    except OSError as e:
        raise ManifestExportError(f"cannot write {target}: {e.strerror or e}") from e
    return target


def atomic_write_json(path: Path, data: Any) -> None:
    """Replace `path` with `data` as JSON (datetimes as ISO 8601), all or nothing, durably
    (tmp + fsync + os.replace)."""
    text = json.dumps(
        data, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False, default=json_default
    )
    text += "\n"
    directory = path.parent
    mode = path.stat().st_mode & 0o777 if path.exists() else _NEW_FILE_MODE
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)  # mkstemp's 0600 would otherwise replace the file's permissions
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(text)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (POSIX; a no-op where directories cannot be opened)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(directory, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
