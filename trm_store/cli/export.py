"""`trm export TABLE`: one read model as CSV, JSON Lines or Parquet, for analysis elsewhere.

The rows are `trm_store.domain.tables.table_rows` (the domain's own queries); the store is
opened read-only. JSON Lines keeps every value's type (times as ISO 8601, nested values as
JSON); CSV and Parquet are flat, so nested values (a gate's parameters, a call's attempts) are
written as JSON text there, times as ISO 8601 in CSV and as UTC timestamps in Parquet (through
pandas and pyarrow, the `frames` extra). With --out the file is written whole or not at all
(a temporary file renamed into place).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Any

from trm_store.bootstrap import open_store
from trm_store.domain._common import json_default
from trm_store.domain.tables import EXPORT_TABLES, table_rows

__all__ = ["add_parser", "run"]

FORMATS = ("csv", "jsonl", "parquet")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "export",
        help="write one table (runs, predictions, ...) as CSV, JSON Lines or Parquet",
        description="Write one read model as CSV, JSON Lines or Parquet, to --out or standard "
        "output. JSON Lines keeps nested values and types; CSV and Parquet write nested "
        "values as JSON text. Parquet needs the `frames` extra and --out. Read-only.",
    )
    parser.add_argument(
        "table",
        choices=list(EXPORT_TABLES),
        metavar="TABLE",
        help=f"one of: {', '.join(EXPORT_TABLES)}",
    )
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument("--format", choices=FORMATS, default="csv")
    parser.add_argument("--out", metavar="FILE", help="write here instead of standard output")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.format == "parquet" and args.out is None:
        print("trm: --format parquet needs --out FILE (it is binary)", file=sys.stderr)
        return 2
    with open_store(args.db, read_only=True) as store:
        if args.format == "parquet":
            try:
                frame = _flat_frame(store, args.table)
            except ImportError as exc:
                print(f"trm: {exc}", file=sys.stderr)
                return 2
        else:
            rows = table_rows(store, args.table)
    if args.format == "parquet":
        return _write_file(Path(args.out), lambda path: frame.to_parquet(path, index=False))
    text = _csv(rows) if args.format == "csv" else _jsonl(rows)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    return _write_file(Path(args.out), lambda path: path.write_text(text, encoding="utf-8"))


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(
        json.dumps(row, default=json_default, ensure_ascii=False, allow_nan=False) + "\n"
        for row in rows
    )


def _cell(value: object) -> object:
    """A CSV cell: empty for None, ISO 8601 for times, JSON for bools and nested values."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool | dict | list):
        return json.dumps(value, default=json_default, ensure_ascii=False)
    return value


def _csv(rows: list[dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(name)) for name in columns])
    return out.getvalue()


def _flat_frame(store: Any, table: str) -> Any:
    """The table's data frame with nested values as JSON text (Parquet columns are flat)."""
    from trm_store import frames  # the optional `frames` extra, loaded only for Parquet

    frame = frames.frame(store, table)
    for name in frame.columns:
        if frame[name].map(lambda v: isinstance(v, dict | list)).any():
            frame[name] = frame[name].map(
                lambda v: v if v is None else json.dumps(v, default=json_default)
            )
    return frame


def _write_file(path: Path, write: Callable[[Path], object]) -> int:
    """Write through a temporary file in the same folder, renamed into place: whole or nothing.
    A symlink keeps pointing where it did (its target is written); a FIFO or a device
    (`/dev/stdout`) is written in place, never renamed over (that would replace it)."""
    try:
        kind = path.stat().st_mode
    except FileNotFoundError:
        kind = None
    except OSError as exc:
        print(f"trm: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if kind is not None and not stat.S_ISREG(kind):
        return _written(path, lambda: write(path))
    shown, path = path, path.resolve()
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        print(f"trm: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # as a plain open() would create it, not mkstemp's 0600

    def write_and_rename() -> None:
        write(Path(tmp))
        os.replace(tmp, path)

    try:
        return _written(shown, write_and_rename)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(tmp)


def _written(path: Path, write: Callable[[], object]) -> int:
    """Run `write`; its failure as one line (exit 2), else `wrote PATH`."""
    try:
        write()
    except ImportError as exc:  # pandas without pyarrow
        print(
            f"trm: --format parquet needs pyarrow: pip install 'trm[frames]' ({exc})",
            file=sys.stderr,
        )
        return 2
    except OSError as exc:
        print(f"trm: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"trm: wrote {path}", file=sys.stderr)
    return 0
