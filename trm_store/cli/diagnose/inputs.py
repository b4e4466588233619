"""The items file of `trm diagnose`: JSONL, one item a line, checked whole before anything is sent.

Each line is a JSON object with a `question_id` (a valid id, unique in the file) and any other
fields; a bad line, a duplicate id or an empty file is a DiagnoseInputError naming the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trm_store.domain._common import check_id
from trm_store.domain.errors import DiagnoseInputError, DomainInputError

__all__ = ["Item", "load_items"]


@dataclass(frozen=True, slots=True)
class Item:
    """One line of the items file: its question id and every other field."""

    question_id: str
    fields: dict[str, Any]


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def load_items(path: Path) -> list[Item]:
    """Every item of a JSONL file; DiagnoseInputError naming the line for a bad or duplicate one."""
    items: list[Item] = []
    first_seen: dict[str, int] = {}
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    item = _item(line, f"{path}:{number}")
                    if item.question_id in first_seen:
                        raise DiagnoseInputError(
                            f"{path}:{number}: duplicate question_id {item.question_id!r} "
                            f"(first on line {first_seen[item.question_id]})"
                        )
                    first_seen[item.question_id] = number
                    items.append(item)
    except FileNotFoundError as e:
        raise DiagnoseInputError(f"items file {str(path)!r} does not exist") from e
    except (OSError, UnicodeDecodeError) as e:
        raise DiagnoseInputError(f"cannot read items file {str(path)!r}: {e}") from e
    if not items:
        raise DiagnoseInputError(f"items file {str(path)!r} holds no items")
    return items


def _item(line: str, where: str) -> Item:
    try:
        value = json.loads(line, parse_constant=_refuse_constant)
    except ValueError as e:
        raise DiagnoseInputError(f"{where}: not valid JSON ({e})") from e
    if not isinstance(value, dict) or "question_id" not in value:
        raise DiagnoseInputError(f"{where}: an item must be a JSON object with a question_id")
    fields = dict(value)
    question_id = fields.pop("question_id")
    try:
        check_id("question_id", question_id)
    except DomainInputError as e:
        raise DiagnoseInputError(f"{where}: {e}") from e
    return Item(question_id, fields)
