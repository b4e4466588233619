"""Issue 15.7: SSE as the spec says. A leading BOM is ignored, media types are compared without
case, `{"error": null}` is no error payload, a cached `error` answer is never served, and a line
is bounded: past `MAX_LINE_CHARS` the stream is refused (`line_too_long`) without reading on.

Before the fix a BOM dropped the first chunk (and the shortened answer was returned with `stop`
and cached), `Text/Event-Stream` was refused, `{"error": null}` failed the stream, an `error`
entry was served from the cache, and the decoder's time grew with the square of a line's length.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trm_llm import RetriesExhausted, RetryPolicy, SqliteResponseCache, SseAnomaly
from trm_llm.cache import CachedResponse
from trm_llm.simulated_server import SSE_HEADERS, Reply, SimulatedServer, normal, sse
from trm_llm.sse import MAX_LINE_CHARS, SseDecoder, parse_stream

from .conftest import USER, ClientFactory, ListSink

BOM = b"\xef\xbb\xbf"


def _body(reply: Reply) -> bytes:
    return b"".join(step for step in reply.steps if isinstance(step, bytes))


def _content_first(tokens: list[str]) -> tuple[bytes | float, ...]:
    """An answer whose first event carries content (no role-only chunk before it)."""
    return normal(tokens).steps[1:]


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, 600), max_size=8, unique=True))
def test_a_leading_bom_is_ignored_wherever_the_chunks_split(cuts: list[int]) -> None:
    raw = BOM + b"".join(p for p in _content_first(["first", " second"]) if isinstance(p, bytes))
    bounds = [0, *sorted(c for c in cuts if c < len(raw)), len(raw)]
    pieces = [raw[a:b] for a, b in itertools.pairwise(bounds)]
    assert parse_stream(pieces).content == "first second"


def test_a_bom_later_in_the_stream_is_data_not_dropped() -> None:
    raw = _body(normal(["a"])).replace(b"data: [DONE]", BOM + b"data: [DONE]")
    with pytest.raises(SseAnomaly):  # U+FEFF then "data" is a field named "\ufeffdata"
        parse_stream([raw])


async def test_a_bom_stream_through_the_client_is_whole_and_cached_whole(
    server: SimulatedServer, make_client: ClientFactory, tmp_path: Path
) -> None:
    server.script(Reply(steps=(BOM, *_content_first(["first", " second"]))))
    client = make_client(cache=SqliteResponseCache(tmp_path / "c.db", ttl_s=60))
    assert (await client.chat(USER)).content == "first second"
    again = await client.chat(USER)
    assert (again.content, again.cached) == ("first second", True)


@pytest.mark.parametrize(
    "media_type",
    ["Text/Event-Stream", "TEXT/EVENT-STREAM; charset=utf-8", "text/event-stream ;charset=UTF-8"],
)
async def test_media_types_are_compared_without_case(
    server: SimulatedServer, make_client: ClientFactory, media_type: str
) -> None:
    headers = tuple((n, media_type if n == "Content-Type" else v) for n, v in SSE_HEADERS)
    server.script(Reply(headers=headers, steps=normal().steps))
    assert (await make_client().chat(USER)).content == "Hello, world"


def test_an_error_field_of_null_is_no_error_payload() -> None:
    chunk = {"error": None, "choices": [{"index": 0, "delta": {"content": "x"}}]}
    end = {"error": None, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    assert parse_stream([sse(chunk), sse(end), sse("[DONE]")]).content == "x"
    with pytest.raises(SseAnomaly) as info:
        parse_stream([sse({"error": {"message": "overloaded"}}), sse("[DONE]")])
    assert info.value.reason == "error_payload"


@pytest.mark.parametrize("finish", ["error", "abort"])
async def test_a_cached_error_answer_is_never_served(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink, tmp_path: Path, finish: str
) -> None:
    cache = SqliteResponseCache(tmp_path / "c.db", ttl_s=60, sink=sink)
    client = make_client(cache=cache)
    key = cache.build_key("sim", USER, endpoint=client.base_url)
    assert await cache.set(key, CachedResponse(content="x", finish_reason="stop", model="sim"))
    with sqlite3.connect(tmp_path / "c.db") as conn:  # as another writer (or a bug) left it
        [(raw,)] = conn.execute("SELECT value FROM llm_response_cache").fetchall()
        doc = json.loads(raw)
        doc["response"]["finish_reason"] = finish
        conn.execute("UPDATE llm_response_cache SET value = ?", (json.dumps(doc),))
    answer = await client.chat(USER)
    assert (answer.content, answer.cached) == ("Hello, world", False)
    [corrupt] = sink.of("cache_corrupt")
    assert corrupt["reason"] == "wrong_shape" and finish in corrupt["detail"]


def _feed_long_line(decoder: SseDecoder, total: int, chunk: int) -> int:
    """Feed a `data:` line of `total` bytes in `chunk`-byte pieces; return the pieces fed
    before the decoder refused it."""
    fed = 0
    piece = b"x" * chunk
    with pytest.raises(SseAnomaly) as info:
        decoder.feed(b"data: ")
        for _ in range(total // chunk):
            fed += 1
            decoder.feed(piece)
    assert info.value.reason == "line_too_long"
    return fed


def test_a_32_mb_line_is_refused_as_soon_as_the_bound_is_passed() -> None:
    chunk = 64 * 1024
    fed = _feed_long_line(SseDecoder(), 32 * 1024 * 1024, chunk)
    # Refused when the bound is passed: the other 24 MB are never read.
    assert MAX_LINE_CHARS // chunk <= fed <= MAX_LINE_CHARS // chunk + 1


def test_an_event_of_many_data_lines_is_bounded_too() -> None:
    decoder = SseDecoder(max_line_chars=1000)
    with pytest.raises(SseAnomaly) as info:
        decoder.feed(b"data: " + b"y" * 100 + b"\n" * 1)
        for _ in range(20):
            decoder.feed(b"data: " + b"y" * 100 + b"\n")
    assert info.value.reason == "line_too_long"


def test_a_long_line_under_the_bound_still_decodes() -> None:
    content = "z" * (4 * 1024 * 1024)
    body = _body(normal([content]))
    pieces = [body[i : i + 65536] for i in range(0, len(body), 65536)]
    assert parse_stream(pieces).content == content


async def test_a_32_mb_line_through_the_client_is_a_typed_refusal(
    server: SimulatedServer, make_client: ClientFactory, sink: ListSink
) -> None:
    server.script(Reply(steps=(b"data: " + b"x" * (32 * 1024 * 1024) + b"\n\n",)))
    client = make_client(retry=RetryPolicy(max_attempts=1))
    with pytest.raises(RetriesExhausted) as info:
        await client.chat(USER)
    assert isinstance(info.value.last_error, SseAnomaly)
    assert info.value.last_error.reason == "line_too_long"
    assert sink.of("call_failed")[0]["reason"] == "line_too_long"
