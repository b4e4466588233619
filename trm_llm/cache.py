"""The response cache contract: the pure key, the stored value, and how failures are reported.

A cache key is the sha256 of canonical JSON (sorted keys, fixed separators, ASCII, no NaN) of::

    {"v": CACHE_KEY_VERSION, "endpoint": ..., "model": ..., "messages": [...],
     "params": {...}, "salt": cache_salt}

- `messages` are keyed whole, every field included (`reasoning_content` and `reasoning` too), so
  two conversations that differ only in an earlier turn's reasoning never share an answer.
- `params` are the generation parameters. Everything a caller passes is one, except the transport
  fields in `TRANSPORT_PARAMS` (how the answer travels, not what it says), which are dropped. An
  unknown parameter therefore changes the key: a needless miss costs one call, a false hit replays
  a stale sample into the training signal. Normalisation, so equal requests share a key: a `None`
  value means "not set" and is dropped; `stop="x"` is `stop=["x"]`; an integral float is its int
  (`temperature=1` and `temperature=1.0` are one request); tuples are lists. `model` and
  `messages` inside params are refused (they have their own arguments).
- `cache_salt=None` is keyed as `null`: the unsalted key, distinct from every salted one. An
  epoch salt such as `f"{run_id}:e{epoch}"` makes the next epoch re-sample while a resumed epoch
  still hits.

Backends store the key under a namespace (`namespace:hexdigest` in Redis, a namespace column in
SQLite), so prompt text never appears in key names, and store an envelope
`{"v": CACHE_KEY_VERSION, "response": CachedResponse}`. A stored entry that is not valid JSON, not
that shape, or of another version is a miss plus a `cache_corrupt` event; a failed read is a miss
plus `cache_read_failed`; a failed write returns False plus `cache_write_failed`. These events go
to the sink with source `"cache"` (stream `llm:cache` through the store sink) and are logged as
warnings; a cache never raises for a storage failure.

Bad input (no canonical JSON form: NaN, non-str keys, objects; a reserved param; a key string
that is not a digest; a bad namespace) raises `CacheKeyError` and nothing is read or stored; the
tree is drawn in `trm_llm.errors`. An entry whose `finish_reason` is an error finish (`error`,
`abort`) is corrupt: such an answer is never served.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

from trm_llm.errors import CacheKeyError, CorruptEntryError
from trm_llm.protocols import EventSink
from trm_llm.sanitise import storable_text
from trm_llm.sse import ERROR_FINISHES

__all__ = [
    "CACHE_EVENT_SOURCE",
    "CACHE_KEY_VERSION",
    "TRANSPORT_PARAMS",
    "CacheKeyError",
    "CacheReporter",
    "CachedResponse",
    "CorruptEntryError",
    "ResponseCache",
    "build_cache_key",
    "check_key",
    "check_namespace",
    "decode_entry",
    "encode_entry",
    "normalise_params",
]

logger = logging.getLogger("trm_llm.cache")

CACHE_KEY_VERSION = 1
"""Bump when the key payload or the stored envelope changes: old entries then miss cleanly."""

TRANSPORT_PARAMS = frozenset(
    {"stream", "stream_options", "timeout", "request_timeout", "extra_headers", "extra_query"}
)
"""Request fields that change how an answer travels, not what it is; they never enter the key."""

CACHE_EVENT_SOURCE = "cache"
"""The `source` cache events are emitted under (stream `llm:cache` through the store sink)."""

_RESERVED_PARAMS = frozenset({"model", "messages"})
_DIGEST = re.compile(r"[0-9a-f]{64}")
_NAMESPACE = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


class CachedResponse(BaseModel):
    """One complete answer as the cache stores it (only answers that passed completeness)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    content: str
    reasoning: str | None = None
    finish_reason: str
    usage: dict[str, Any] | None = None
    model: str


def _canonical(value: Any, path: str) -> Any:
    """Return the JSON normal form of `value`, refusing what has none (see module docstring)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CacheKeyError(f"{path} is {value!r}; NaN and infinities cannot be keyed")
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise CacheKeyError(f"{path} has a non-string key {name!r}")
            out[name] = _canonical(item, f"{path}.{name}")
        return out
    if isinstance(value, list | tuple):
        return [_canonical(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise CacheKeyError(f"{path} is a {type(value).__name__}, which has no canonical JSON form")


def normalise_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Generation params in normal form: transport fields and None dropped, `stop` as a list."""
    out: dict[str, Any] = {}
    for name, value in (params or {}).items():
        if not isinstance(name, str):
            raise CacheKeyError(f"param name {name!r} is not a string")
        if name in _RESERVED_PARAMS:
            raise CacheKeyError(f"param {name!r} is passed as its own argument, not in params")
        if name in TRANSPORT_PARAMS or value is None:
            continue
        if name == "stop" and isinstance(value, str):
            value = [value]
        out[name] = _canonical(value, f"params.{name}")
    return out


def build_cache_key(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    cache_salt: str | None = None,
    params: Mapping[str, Any] | None = None,
    *,
    endpoint: str = "",
) -> str:
    """The cache key (64 hex chars) of one request; pure, so every backend and process agrees."""
    if not isinstance(model, str) or not model:
        raise CacheKeyError(f"model must be a non-empty string, got {model!r}")
    if not isinstance(endpoint, str):
        raise CacheKeyError(f"endpoint must be a string, got {type(endpoint).__name__}")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise CacheKeyError(f"cache_salt must be a string or None, got {type(cache_salt).__name__}")
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise CacheKeyError("messages must be a sequence of mappings")
    keyed_messages = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise CacheKeyError(f"messages[{i}] is a {type(message).__name__}, not a mapping")
        keyed_messages.append(_canonical(message, f"messages[{i}]"))
    payload = {
        "v": CACHE_KEY_VERSION,
        "endpoint": endpoint,
        "model": model,
        "messages": keyed_messages,
        "params": normalise_params(params),
        "salt": cache_salt,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def check_key(key: str) -> str:
    """Refuse a key that is not a digest from `build_cache_key` (keeps prompt text out of names)."""
    if not isinstance(key, str) or _DIGEST.fullmatch(key) is None:
        raise CacheKeyError("a cache key must be the 64 lowercase hex chars of build_key()")
    return key


def check_namespace(namespace: str) -> str:
    """Refuse an empty or odd namespace (1-100 chars of letters, digits, `_.:-`)."""
    if not isinstance(namespace, str) or _NAMESPACE.fullmatch(namespace) is None:
        raise CacheKeyError(f"namespace must be 1-100 chars of [A-Za-z0-9_.:-], got {namespace!r}")
    return namespace


def encode_entry(value: CachedResponse) -> str:
    """The stored form of `value`: a versioned JSON envelope."""
    if not isinstance(value, CachedResponse):
        raise TypeError(f"a cache stores CachedResponse values, got {type(value).__name__}")
    return f'{{"v":{CACHE_KEY_VERSION},"response":{value.model_dump_json()}}}'


def decode_entry(raw: str | bytes) -> CachedResponse:
    """Decode a stored envelope; anything else raises `CorruptEntryError`."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the stack
        raise CorruptEntryError("bad_json", str(exc) or type(exc).__name__) from None
    if not isinstance(doc, dict) or set(doc) != {"v", "response"}:
        raise CorruptEntryError("wrong_shape", "expected an object with keys v and response")
    version = doc["v"]
    if isinstance(version, bool) or version != CACHE_KEY_VERSION:
        raise CorruptEntryError(
            "wrong_version", f"entry version {version!r}, expected {CACHE_KEY_VERSION}"
        )
    try:
        response = CachedResponse.model_validate(doc["response"])
    except ValidationError as exc:
        fields = sorted({".".join(map(str, err["loc"])) or "response" for err in exc.errors()})
        raise CorruptEntryError("wrong_shape", f"invalid fields: {', '.join(fields)}") from None
    except RecursionError:
        raise CorruptEntryError("wrong_shape", "response nested too deeply") from None
    if response.finish_reason in ERROR_FINISHES:
        raise CorruptEntryError("wrong_shape", f"finish_reason {response.finish_reason}")
    return response


class CacheReporter:
    """Turns a backend's storage trouble into one sink event plus one warning, never an error."""

    def __init__(self, backend: str, namespace: str, sink: EventSink | None) -> None:
        self._backend = backend
        self._namespace = namespace
        self._sink = sink

    def decoded(self, key: str, raw: str | bytes | None) -> CachedResponse | None:
        """What a backend read for `key`: the answer, or None for a miss or a corrupt entry
        (reported as `cache_corrupt`)."""
        if raw is None:
            return None
        try:
            return decode_entry(raw)
        except CorruptEntryError as err:
            self._emit("cache_corrupt", key, reason=err.reason, detail=err.detail)
            return None

    def read_failed(self, key: str, exc: BaseException) -> None:
        """The storage could not be read; the caller treats it as a miss."""
        self._emit("cache_read_failed", key, error=type(exc).__name__, detail=str(exc))

    def write_failed(self, key: str, exc: BaseException) -> None:
        """The storage refused a write; the caller returns False."""
        self._emit("cache_write_failed", key, error=type(exc).__name__, detail=str(exc))

    def _emit(self, event_type: str, key: str, **fields: str) -> None:
        # A detail quotes the stored entry or the storage's error: keep it storable.
        fields = {name: storable_text(value, 300) for name, value in fields.items()}
        data = {"backend": self._backend, "namespace": self._namespace, "key": key, **fields}
        details = ", ".join(f"{name}={value}" for name, value in data.items())
        logger.warning("%s: %s", event_type, details)
        if self._sink is None:
            return
        try:
            self._sink.emit(CACHE_EVENT_SOURCE, event_type, data)
        except Exception:
            logger.exception("the event sink failed to record %s", event_type)


@runtime_checkable
class ResponseCache(Protocol):
    """Where complete answers are kept; subclass it to inherit the pure `build_key`."""

    def build_key(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        cache_salt: str | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        endpoint: str = "",
    ) -> str:
        """The key of one request: `build_cache_key` (the same for every backend)."""
        return build_cache_key(model, messages, cache_salt, params, endpoint=endpoint)

    async def get(self, key: str) -> CachedResponse | None:
        """The stored answer, or None for a miss (also for a corrupt entry or a failed read)."""
        ...

    async def set(self, key: str, value: CachedResponse) -> bool:
        """Store `value` for the cache's TTL; False (and an event) when the write failed."""
        ...
