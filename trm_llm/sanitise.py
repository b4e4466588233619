"""Hostile values made storable, so every call's event is written and says what was changed.

The store refuses what it cannot keep (NUL, lone surrogates, NaN, ints past 64 bits, strings
past a field's length, an HTTP status outside 100-599, JSON nested past the stack), and a
refused event used to mean an unrecorded call. `clean_event` takes a `call_completed` or
`call_failed` payload as the governor builds it and returns one the store accepts: text has
NUL and lone surrogates replaced by U+FFFD and is cut to its field's length, a status outside
100-599 becomes null, usage is bounded (see `clean_usage`). Each change adds a note, and the
notes go into the payload's `sanitised` list (absent when nothing was changed).
`repair_text` is the surrogate repair alone: two JSON-escaped UTF-16 halves of one character,
streamed in separate events, are joined back into the character.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "INT_MAX",
    "USAGE_MAX_DEPTH",
    "USAGE_MAX_ITEMS",
    "clean_event",
    "clean_usage",
    "repair_text",
    "storable_text",
]

INT_MAX = 2**31 - 1
"""Largest usage count kept (the read model's token columns are 32-bit); larger is clamped."""
USAGE_MAX_DEPTH = 4
"""Usage nesting kept (usage.prompt_tokens_details.cached_tokens is depth 2); deeper is dropped."""
USAGE_MAX_ITEMS = 64
"""Keys per object / items per list kept in usage."""

_TEXT_LIMITS = {
    "call_id": 255,
    "parent_call_id": 255,
    "model": 255,
    "profile": 255,
    "finish_reason": 255,
    "reason": 255,
    "endpoint": 2000,
    "cache_salt": 1000,
    "detail": 1000,
}
_MAX_NOTES = 20
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_REPLACEMENT = "\ufffd"


def storable_text(value: str, limit: int) -> str:
    """`value` with NUL and lone surrogates replaced by U+FFFD, cut to `limit` characters."""
    if _UNSTORABLE.search(value) is not None:
        value = _UNSTORABLE.sub(_REPLACEMENT, repair_text(value))
    return value[:limit]


def repair_text(text: str) -> str:
    """`text` with surrogate pairs joined into their character and lone halves replaced."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


class _Notes:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, note: str) -> None:
        if len(self.items) < _MAX_NOTES:
            self.items.append(note[:200])
        elif len(self.items) == _MAX_NOTES:
            self.items.append("more values were sanitised")

    def text(self, where: str, value: str, limit: int) -> str:
        if _UNSTORABLE.search(value) is not None:
            self.add(f"{where}: NUL or lone surrogate replaced by U+FFFD")
        if len(value) > limit:
            self.add(f"{where}: {len(value)} characters truncated to {limit}")
        return storable_text(value, limit)

    def status(self, where: str, value: Any) -> int | None:
        if value is None or (type(value) is int and 100 <= value <= 599):
            return value
        self.add(f"{where}: {str(value)[:20]} is no HTTP status (100-599), replaced by null")
        return None

    def usage(self, where: str, value: Any, depth: int) -> Any:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if 0 <= value <= INT_MAX:
                return value
            clamped = min(max(value, 0), INT_MAX)
            self.add(f"{where}: {str(value)[:24]} clamped to {clamped}")
            return clamped
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            self.add(f"{where}: {value} replaced by null")
            return None
        if isinstance(value, str):
            return self.text(where, value, 255)
        if depth >= USAGE_MAX_DEPTH:
            self.add(f"{where}: nested deeper than {USAGE_MAX_DEPTH}, dropped")
            return None
        if isinstance(value, Mapping):
            return self._mapping(where, value, depth)
        if isinstance(value, list | tuple):
            if len(value) > USAGE_MAX_ITEMS:
                self.add(f"{where}: {len(value)} items cut to {USAGE_MAX_ITEMS}")
            items = list(value)[:USAGE_MAX_ITEMS]
            return [self.usage(f"{where}[{i}]", v, depth + 1) for i, v in enumerate(items)]
        self.add(f"{where}: a {type(value).__name__} is no JSON value, dropped")
        return None

    def _mapping(self, where: str, value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
        if len(value) > USAGE_MAX_ITEMS:
            self.add(f"{where}: {len(value)} keys cut to {USAGE_MAX_ITEMS}")
        out: dict[str, Any] = {}
        for n, (name, item) in enumerate(value.items()):
            if n >= USAGE_MAX_ITEMS:
                break
            key = self.text(f"{where} key", str(name), 255)
            out[key] = self.usage(f"{where}.{key}", item, depth + 1)
        return out


def clean_usage(usage: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """Usage the store and the cache can keep, and the notes of what was changed."""
    notes = _Notes()
    if usage is None:
        return None, []
    if not isinstance(usage, Mapping):
        notes.add("usage: not an object, dropped")
        return None, notes.items
    return notes._mapping("usage", usage, 0), notes.items


def clean_event(data: Mapping[str, Any], notes_so_far: list[str] | None = None) -> dict[str, Any]:
    """A `call_completed` / `call_failed` payload the store accepts (module docstring)."""
    notes = _Notes()
    for note in notes_so_far or []:
        notes.add(note)
    out = dict(data)
    for name, limit in _TEXT_LIMITS.items():
        value = out.get(name)
        if isinstance(value, str):
            out[name] = notes.text(name, value, limit)
    if out.get("parent_call_id") == "":
        out["parent_call_id"] = None
        notes.add("parent_call_id: empty, replaced by null")
    for name in ("reason", "finish_reason"):
        if out.get(name) == "":
            out[name] = "unknown"
            notes.add(f"{name}: empty, replaced by 'unknown'")
    if "status" in out:
        out["status"] = notes.status("status", out["status"])
    if "usage" in out:
        out["usage"] = notes.usage("usage", out["usage"], 0) if out["usage"] is not None else None
    attempts = []
    for attempt in out.get("attempts", []):
        n = attempt.get("n")
        cleaned = dict(attempt)
        cleaned["status"] = notes.status(f"attempts[{n}].status", attempt.get("status"))
        if isinstance(attempt.get("reason"), str):
            cleaned["reason"] = notes.text(f"attempts[{n}].reason", attempt["reason"], 255)
        attempts.append(cleaned)
    if "attempts" in out:
        out["attempts"] = attempts
    if notes.items:
        out["sanitised"] = notes.items
    return out
