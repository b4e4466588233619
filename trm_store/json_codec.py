"""The canonical JSON codec of the log: what an event's data and meta are written as, and read back.

Canonical: keys sorted, no spaces, ASCII only, no NaN or infinities, no NUL, no surrogate code
points (PostgreSQL cannot store NUL in JSON, so no backend accepts it; a surrogate is not valid
Unicode, and a pair of them would read back as another string). The text is written as is, so the
same event reads back the same on either backend.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import repeat
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from json.scanner import make_scanner
from typing import Any

from trm_store.errors import EventValidationError
from trm_store.vocabulary import text_problem

__all__ = [
    "choose_encoder",
    "dumps_json",
    "dumps_json_all",
    "loads_json",
    "same_json",
    "serialize_json",
]

Encode = Callable[[Any], str]
Chunks = Callable[[Any, int], list[str]]


# An escaped NUL that is not itself an escaped backslash followed by "u0000".
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# An escaped surrogate that is not half of a pair (json.dumps escapes a valid pair as two).
_LONE_SURROGATE = re.compile(
    r"(?<!\\)(?:\\\\)*(?:\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})"
    r"|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2})"
)


_CANONICAL = json.JSONEncoder(
    allow_nan=False, sort_keys=True, separators=(",", ":"), check_circular=False
)


def _not_json(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_PROBE_TEXTS: tuple[Any, ...] = (
    {"z": [1, -2, 2**70, 2.5, -0.0, 1e16, 1e-7, True, False, None], "a": {"y": [], "x": {}}},
    {"text": 'é\u2028"\\\n\t\x00\x7f\ud83d\ude00 \ud800', "": "", "B": "b", "a": "A"},
    ["bare", 0, 1.0, [[[]]], (1, 2)],
    {2: "int keys", 10: "sorted as numbers", -1: ""},
    {2.5: "float keys"},
    {True: "bool keys", False: ""},
    "a bare string",
    12345678901234567890,
)
"""Values of every kind the store writes, whose texts both encoders must agree on."""
_PROBE_ERRORS: tuple[tuple[Any, type[Exception]], ...] = (
    (float("nan"), ValueError),
    ({"x": [float("inf")]}, ValueError),
    ({"x": object()}, TypeError),
    ({"x": b"bytes"}, TypeError),
)
"""Values both encoders must refuse, with the error they raise."""


def _c_chunks(make_encoder: Any, sort_keys: bool = True) -> Chunks:
    """The C encoder that `_CANONICAL.encode` builds on every call (the same arguments), built
    once: `encode` spends ~1 us of a 1.6-2.7 us encode building it, for every event's data and
    meta and every JSON projection column. It writes a value's text as a list of chunks. Cycles
    are not tracked: a cyclic value raises RecursionError (the caller's error), as a value
    nested too deep does. `sort_keys=False`: the same encoder writing dicts in their own order,
    for values whose keys are in sorted order already (`dumps_json_all`)."""
    chunks: Chunks = make_encoder(
        None, _not_json, encode_basestring_ascii, None, ":", ",", sort_keys, False, False
    )
    return chunks


def _c_encoder(make_encoder: Any) -> Encode:
    """`_c_chunks`' encoder, its chunks joined."""
    chunks = _c_chunks(make_encoder)
    return lambda value: "".join(chunks(value, 0))


def _refuses(encode: Encode, value: Any, error: type[Exception]) -> bool:
    try:
        encode(value)
    except error:
        return True
    return False


def _pure_python(value: Any) -> str:
    """The public encoder's own Python implementation (`iterencode` without `_one_shot` never
    takes the C path): what the C encoder is checked against."""
    return "".join(_CANONICAL.iterencode(value))


def choose_encoder(make_encoder: Any, reference: Encode = _pure_python) -> Encode:
    """The C encoder built once from `make_encoder` when it writes exactly what `reference` writes
    and refuses what it refuses; otherwise the public encoder, `_CANONICAL.encode`.

    Run once at import on `json.encoder.c_make_encoder`, a private interpreter function whose
    arguments could change in a Python upgrade: a changed one costs speed, never a different text.
    """
    if make_encoder is None:
        return _CANONICAL.encode
    try:
        fast = _c_encoder(make_encoder)
        same = all(fast(value) == reference(value) for value in _PROBE_TEXTS) and all(
            _refuses(fast, value, error) for value, error in _PROBE_ERRORS
        )
    except Exception:  # any failure of the private encoder means: do not use it
        return _CANONICAL.encode
    return fast if same else _CANONICAL.encode


def _in_key_order(value: Any) -> Any:
    """`value` with every dict's keys in sorted order, or None if any key is not a string."""
    if isinstance(value, dict):
        if not all(type(key) is str for key in value):
            return None
        return {key: _in_key_order(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [_in_key_order(item) for item in value]
    return value


def _unsorted_chunks(make_encoder: Any, encode: Encode) -> Chunks | None:
    """The C encoder without its sort, when it writes what `encode` writes for values whose
    keys are in sorted order already (probed like `choose_encoder`), else None."""
    try:
        chunks = _c_chunks(make_encoder, sort_keys=False)
        probes = [p for p in map(_in_key_order, _PROBE_TEXTS) if p is not None]
        same = all("".join(chunks(value, 0)) == encode(value) for value in probes)
    except Exception:
        return None
    return chunks if same else None


_encode = choose_encoder(c_make_encoder)
_chunks = _c_chunks(c_make_encoder) if _encode != _CANONICAL.encode else None
"""The C encoder itself when `_encode` is it: `dumps_json_all` maps it over many values."""
_chunks_in_order = None if _chunks is None else _unsorted_chunks(c_make_encoder, _encode)
"""The same without sorting keys: for values whose keys are in sorted order already."""


def dumps_json(value: Any, *, what: str) -> str:
    """Canonical JSON; NaN, infinities, NUL characters and non-JSON values raise
    EventValidationError (PostgreSQL cannot store NUL in JSON, so no backend accepts it).

    An exact `str`, which sqlite3 binds at once: for a `str` subclass it first looks up an
    adapter, then `__adapt__` and `__conform__` (formatting and dropping an AttributeError),
    twice an appended event and once a JSON column of every projection row."""
    try:
        # A bare string (a projection's text column kept as JSON) skips the encoder's setup.
        text = encode_basestring_ascii(value) if type(value) is str else _encode(value)
    except (TypeError, ValueError, RecursionError) as e:
        raise EventValidationError(f"{what} is not JSON: {e}") from e
    if "\\u" in text:  # rare: ASCII text, where only other characters (or "\\" + "u") hold one
        _refuse_escaped(value, text, what)
    return text


def dumps_json_all(values: list[Any], *, what: str, keys_sorted: bool = False) -> list[str]:
    """`dumps_json` of each of `values` (the data of an append's events): the C encoder mapped
    over them, no Python call a value (timeit, 100 prediction-shaped dicts: ~0.2-0.4 us a value
    less than a `dumps_json` each). The error does not say which value: a caller that needs to
    know encodes them one by one.

    `keys_sorted`: the caller vouches that every dict in `values`, at every level, has string
    keys in sorted order already (a plain model's normal forms, `trm_store.plain_models`): the
    encoder then writes them as they are, without sorting (~0.23 us a value less, timeit, 100
    prediction-shaped dicts), the same text."""
    chunks = _chunks_in_order if keys_sorted and _chunks_in_order is not None else _chunks
    try:
        texts = (
            list(map(_encode, values))
            if chunks is None
            else list(map("".join, map(chunks, values, repeat(0))))
        )
    except (TypeError, ValueError, RecursionError) as e:
        raise EventValidationError(f"{what} is not JSON: {e}") from e
    if "\\u" in "".join(texts):
        for value, text in zip(values, texts, strict=True):
            if "\\u" in text:
                _refuse_escaped(value, text, what)
    return texts


def _refuse_escaped(value: Any, text: str, what: str) -> None:
    """Refuse the NUL characters and surrogates that `text`, the canonical JSON of `value`, holds
    escaped."""
    if "\\u0000" in text and _NUL.search(text):
        raise EventValidationError(f"{what} contains a NUL character")
    if "\\ud" in text:
        if _LONE_SURROGATE.search(text):
            raise EventValidationError(f"{what} contains a lone surrogate (not valid Unicode)")
        if _surrogate_in(value):
            raise EventValidationError(
                f"{what} contains a surrogate pair written as two characters (not valid "
                "Unicode: it would read back as the one character the pair encodes)"
            )


def _surrogate_in(value: Any) -> bool:
    """Whether any text in `value`, keys included, holds a surrogate code point (text that
    `text_problem` refuses: no UTF-8 encoder takes it; NUL was refused before this is asked).

    The escaped text cannot tell: a character past U+FFFF and the two surrogates that encode it
    in UTF-16 both come out as the same pair of escapes, and read back as the one character.
    So this looks at the value, and only when its text has such an escape (rare).
    """
    if isinstance(value, str):
        return text_problem(value) is not None
    if isinstance(value, dict):
        return any(_surrogate_in(key) or _surrogate_in(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return any(_surrogate_in(item) for item in value)
    return False


_Scanner = Callable[[str, int], tuple[Any, int]]
_scan: _Scanner = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
"""What `json.loads` ends in (the C scanner where CPython has it), built once."""


def loads_json(text: str) -> Any:
    """`json.loads(text)` for JSON the store wrote, without its three Python calls per value.

    It decodes every event's data and meta read back: a rebuild reads millions. Text that is
    not one bare JSON value (whitespace around it, trailing data, invalid JSON) goes to
    `json.loads` itself, which decodes it or raises its usual error.
    """
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


def same_json(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are the same JSON: compared as canonical text, so 1, 1.0
    and true differ, as 0.0 and -0.0 do (Python's == says they are equal), and key order does
    not matter. For values read back from the log (decoded from canonical text) or about to be
    written (`loads_json` of the text), this compares exactly what the log holds."""
    return bool(_encode(a) == _encode(b))


def serialize_json(value: Any) -> str:
    """The engines' JSON serializer: a value bound to a JSON column through SQLAlchemy is
    written as canonical JSON too."""
    return dumps_json(value, what="JSON column value")
