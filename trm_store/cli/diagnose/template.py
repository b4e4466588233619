"""The prompt template of `trm diagnose`: a `string.Template` rendered once per item.

Placeholders: `$question_id`, `$fields` (every other field, one `name: value` line each),
`$tiers` (the allowed answers) and `$name` for any item field; `check` refuses, before anything is
sent, an item that lacks a field the template names.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trm_store.cli.diagnose.inputs import Item
from trm_store.domain.errors import DiagnoseInputError

__all__ = ["DEFAULT_TEMPLATE", "PromptTemplate"]

DEFAULT_TEMPLATE = """\
Judge whether the model's answer in the item below is right.

$fields

Reply with exactly one word, one of: $tiers.
Say "uncertain" if the item does not let you tell.
"""
_RESERVED_PLACEHOLDERS = frozenset({"question_id", "fields", "tiers"})


class PromptTemplate:
    """A `string.Template`: `$question_id`, `$fields` (every other field, one `name: value` line
    each), `$tiers` (the allowed answers), and `$name` for any item field."""

    def __init__(self, text: str, tiers: Sequence[str]) -> None:
        self._template = string.Template(text)
        if not text.strip() or not self._template.is_valid():
            raise DiagnoseInputError(
                "the template must be non-empty and use $name / ${name} placeholders "
                "(write $$ for a literal $)"
            )
        self.tiers = tuple(tiers)
        self.fields = frozenset(self._template.get_identifiers()) - _RESERVED_PLACEHOLDERS

    @classmethod
    def load(cls, path: Path | None, tiers: Sequence[str]) -> PromptTemplate:
        """The template in `path`, or the default one."""
        if path is None:
            return cls(DEFAULT_TEMPLATE, tiers)
        try:
            return cls(path.read_text(encoding="utf-8"), tiers)
        except (OSError, UnicodeDecodeError) as e:
            raise DiagnoseInputError(f"cannot read template {str(path)!r}: {e}") from e

    def check(self, items: Iterable[Item]) -> None:
        """Every item has every field the template names (checked before anything is sent)."""
        for item in items:
            missing = sorted(self.fields - item.fields.keys())
            if missing:
                raise DiagnoseInputError(
                    f"item {item.question_id!r} lacks field(s) {missing} used by the template"
                )

    def render(self, item: Item) -> str:
        """The prompt for one item."""
        values = {name: _text(value) for name, value in item.fields.items()}
        lines = "\n".join(f"{name}: {text}" for name, text in values.items())
        return self._template.substitute(
            values, question_id=item.question_id, fields=lines, tiers=", ".join(self.tiers)
        )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
