"""Answers the log cannot hold as they are: a NUL (refused by the store, and by PostgreSQL's
text) or a split surrogate (a UTF-16 half, which no UTF-8 encoder takes). `poison_of` says which
an answer is, `recordable` is its text with each such character replaced by U+FFFD."""

from __future__ import annotations

import re

__all__ = ["poison_of", "recordable"]

_NUL = "\x00"
_SURROGATE = re.compile("[\ud800-\udfff]")


def poison_of(text: str) -> str | None:
    """`NUL` or `split surrogate` if `text` holds one (NUL first), else None."""
    if _NUL in text:
        return "NUL"
    if _SURROGATE.search(text):
        return "split surrogate"
    return None


def recordable(text: str) -> str:
    """`text` with NULs and lone surrogates replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text.replace(_NUL, "\ufffd"))
