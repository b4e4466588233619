"""The API key: refused when it cannot be a header value, and redacted in every form it may take.

`check_api_key` runs when a client or `LLMSettings` is built. A key is sent as
`Authorization: Bearer <key>`, so it must be visible ASCII (0x21-0x7E): a trailing CR or LF (a
key file saved with CRLF, or read with `.read()`), a space, a tab, a NUL or a non-ASCII
character is refused with `APIKeyError`, whose message says what is wrong and where, never the
key. Left through, such a key made h11 or the encoder raise an error that carried it.

`Redactor` scrubs text before it is shown or stored: the key raw, as `repr` and JSON escape it,
URL-encoded, and any run of `PARTIAL` or more consecutive characters of it (a server that echoes
a truncated key, or a message cut in the middle of one) become `***` (or `###`, `~~~`, `%%%` for
a key that holds a `*`: fragments of it that `***` and its neighbours could spell again).
`scrub_exception` applies it to an exception's args along its cause, context and `last_error`
chain.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from contextlib import suppress
from urllib.parse import quote

from trm_llm.errors import APIKeyError

__all__ = [
    "PARTIAL",
    "REDACTED",
    "Redactor",
    "check_api_key",
    "exception_chain",
    "scrub_exception",
]

PARTIAL = 8
"""A run of this many consecutive characters of the key (or the whole key if shorter) is
redacted wherever it appears."""

REDACTED = "***"


def check_api_key(key: str) -> str:
    """Return `key` if it is a usable header value, else raise `APIKeyError` (key not shown)."""
    if not isinstance(key, str):
        raise APIKeyError(f"the API key must be a string, got {type(key).__name__}")
    if not key:
        raise APIKeyError("the API key is empty; leave it unset for servers that need none")
    for i, char in enumerate(key):
        if not "\x21" <= char <= "\x7e":
            where = "at its end" if i == len(key) - 1 else f"at position {i + 1}"
            raise APIKeyError(
                f"the API key ({len(key)} characters) cannot be sent as a header value: it holds "
                f"{_describe(char)} {where} (strip the key file's line ending and spaces)"
            )
    return key


def _describe(char: str) -> str:
    names = {"\r": "a CR", "\n": "an LF", " ": "a space", "\t": "a tab", "\x00": "a NUL"}
    if char in names:
        return names[char]
    return "a control character" if char.isascii() else "a non-ASCII character"


class Redactor:
    """Replaces every form of one secret in a text by `***` (see the module docstring)."""

    def __init__(self, secret: str | None) -> None:
        self._forms: re.Pattern[str] | None = None
        self._size = min(PARTIAL, len(secret or ""))
        self._grams: frozenset[str] = frozenset()
        if not secret:
            return
        self._marker = next((c * 3 for c in "*#~%" if c not in secret), "\u2026")
        """`***`, or a marker of characters the key lacks: where it stands, no run of it can
        form again with the text around it."""
        forms = {
            secret,
            repr(secret)[1:-1],
            json.dumps(secret)[1:-1],
            json.dumps(secret, ensure_ascii=False)[1:-1],
            quote(secret, safe=""),
        }
        alternatives = sorted(forms, key=len, reverse=True)
        self._forms = re.compile("|".join(map(re.escape, alternatives)))
        size = self._size
        self._grams = frozenset(secret[i : i + size] for i in range(len(secret) - size + 1))

    def __call__(self, text: str) -> str:
        """`text` with every form of the secret, and every fragment of it, replaced."""
        if self._forms is None or not text:
            return text
        text = self._forms.sub(self._marker, text)
        size, grams = self._size, self._grams
        hidden = [False] * len(text)
        for i in range(len(text) - size + 1):
            if text[i : i + size] in grams:
                hidden[i : i + size] = [True] * size
        if not any(hidden):
            return text
        out: list[str] = []
        for i, char in enumerate(text):
            if not hidden[i]:
                out.append(char)
            elif i == 0 or not hidden[i - 1]:
                out.append(self._marker)
        return "".join(out)


def exception_chain(exc: BaseException) -> list[BaseException]:
    """`exc` and every exception it links to (cause, context, `last_error`), each once."""
    seen: dict[int, BaseException] = {}
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen[id(current)] = current
        todo += [current.__cause__, current.__context__, getattr(current, "last_error", None)]
    return list(seen.values())


def scrub_exception(exc: BaseException, redact: Callable[[str], str]) -> None:
    """Redact the string args of `exc` and of every exception it links to, in place."""
    for current in exception_chain(exc):
        with suppress(AttributeError, TypeError):  # an exception type with read-only args
            current.args = tuple(redact(a) if isinstance(a, str) else a for a in current.args)
        for name in ("detail", "message"):
            value = getattr(current, name, None)
            if isinstance(value, str):
                with suppress(AttributeError, TypeError):
                    setattr(current, name, redact(value))
