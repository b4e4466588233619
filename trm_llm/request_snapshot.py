"""A call's messages and params read once, into plain data, before anything looks at them.

The cache key is built from the request, and the request is sent, retried and reported later,
across awaits: had each read the caller's objects, a message another task edits while the call
waits (for its cache lookup, a slot, a backoff) would be sent and its answer cached under the key
of the request before the edit, poisoning the cache for everyone who asks that. So the call works
on a copy taken when it starts: mappings as dicts, lists and tuples (and the sequence of
messages) as lists, every other value as it is (a string or number cannot change). Its content
is the caller's, so the request sent is the one the caller made, in the JSON form it would take
anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trm_llm.errors import LLMConfigError

__all__ = ["snapshot_request"]


def snapshot_request(
    messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
) -> tuple[Sequence[Mapping[str, Any]], dict[str, Any]]:
    """`messages` and `params` copied as plain data (see the module). What is no sequence of
    messages (a string, say) is left as it is, for the checks of the key and the request to
    refuse."""
    try:
        if isinstance(messages, Sequence) and not isinstance(messages, str | bytes):
            messages = [_plain(message) for message in messages]
        return messages, {name: _plain(value) for name, value in params.items()}
    except RecursionError:
        raise LLMConfigError("messages or params nest too deeply, or contain a cycle") from None


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {name: _plain(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
