"""The pure SSE decoder and completeness check, fed bytes directly (no sockets)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trm_llm.errors import SseAnomaly
from trm_llm.sse import (
    PROFILES,
    SseDecoder,
    StreamAccumulator,
    StreamResult,
    get_profile,
    parse_stream,
)


def chunk(
    content: str | None = None,
    *,
    finish: str | None = None,
    index: int = 0,
    reasoning: str | None = None,
    reasoning_key: str = "reasoning_content",
) -> bytes:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta[reasoning_key] = reasoning
    body = {
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def stream(tokens: Sequence[str], *, finish: str = "stop", done: bool = True) -> bytes:
    parts = [chunk(t) for t in tokens] + [chunk(finish=finish)]
    if done:
        parts.append(DONE)
    return b"".join(parts)


def test_complete_stream_joins_content() -> None:
    result = parse_stream([stream(["Hel", "lo", " world"])])
    assert result == StreamResult(
        content="Hello world", reasoning=None, finish_reason="stop", usage=None, model="m"
    )


def test_stream_without_done_is_truncated() -> None:
    # Plan task 3: a stream that ends without [DONE] must not pass as an answer.
    with pytest.raises(SseAnomaly) as info:
        parse_stream([chunk("half")])
    assert info.value.reason == "truncated_no_done"


def test_done_but_choice_without_finish_reason_is_truncated() -> None:
    with pytest.raises(SseAnomaly) as info:
        parse_stream([chunk("a"), DONE])
    assert info.value.reason == "truncated_no_done"


def test_every_choice_must_finish() -> None:
    body = chunk("a", index=0) + chunk("b", index=1) + chunk(finish="stop", index=0) + DONE
    with pytest.raises(SseAnomaly) as info:
        parse_stream([body])
    assert info.value.reason == "truncated_no_done"


def test_done_without_any_choice_is_truncated() -> None:
    with pytest.raises(SseAnomaly) as info:
        parse_stream([DONE])
    assert info.value.reason == "truncated_no_done"


@pytest.mark.parametrize(
    "payload",
    [
        {"error": {"message": "overloaded", "code": 503}},
        {"object": "error", "message": "boom"},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "error"}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "abort"}]},
    ],
)
def test_error_shapes_inside_200_stream(payload: dict[str, Any]) -> None:
    body = chunk("partial") + b"data: " + json.dumps(payload).encode() + b"\n\n" + DONE
    with pytest.raises(SseAnomaly) as info:
        parse_stream([body])
    assert info.value.reason == "error_payload"


def test_named_error_event_is_an_error_payload() -> None:
    body = chunk("x") + b'event: error\ndata: {"message": "x"}\n\n' + DONE
    with pytest.raises(SseAnomaly) as info:
        parse_stream([body])
    assert info.value.reason == "error_payload"


@pytest.mark.parametrize("data", [b'{"choices": [', b"[1, 2]", b'{"choices": "nope"}'])
def test_malformed_json(data: bytes) -> None:
    with pytest.raises(SseAnomaly) as info:
        parse_stream([chunk("a") + b"data: " + data + b"\n\n" + DONE])
    assert info.value.reason == "malformed_json"


def test_usage_only_last_chunk_is_normal() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    body = (
        chunk("ok")
        + chunk(finish="stop")
        + b"data: "
        + json.dumps({"choices": [], "usage": usage}).encode()
        + b"\n\n"
        + DONE
    )
    result = parse_stream([body])
    assert result.content == "ok" and result.usage == usage


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_reasoning_is_kept_apart_from_content(key: str) -> None:
    body = (
        chunk(reasoning="think ", reasoning_key=key)
        + chunk(reasoning="hard", reasoning_key=key)
        + chunk("42")
        + chunk(finish="stop")
        + DONE
    )
    result = parse_stream([body])
    assert (result.content, result.reasoning) == ("42", "think hard")


def test_length_finish_is_returned_flagged() -> None:
    assert parse_stream([stream(["a"], finish="length")]).finish_reason == "length"


def test_unframed_done_at_end_of_body_is_complete() -> None:
    # llama.cpp's server ends with "data: [DONE]" and no blank line after it.
    base = chunk("a") + chunk(finish="stop")
    for tail in (b"data: [DONE]", b"data: [DONE]\n", b"data: [DONE]\r\n", b"data:[DONE]"):
        assert parse_stream([base + tail]).content == "a"


def test_unframed_trailing_non_done_event_is_dropped() -> None:
    with pytest.raises(SseAnomaly) as info:
        parse_stream([chunk("a") + chunk(finish="stop") + b'data: {"choices": [{"index": 0'])
    assert info.value.reason == "truncated_no_done"


def test_keepalive_comments_are_ignored() -> None:
    body = (
        b": keep-alive\n\n"
        + chunk("a")
        + b": OPENROUTER PROCESSING\n\n"
        + chunk(finish="stop")
        + DONE
    )
    assert parse_stream([body]).content == "a"


def test_decoder_counts_only_data_events() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b": keep-alive\n\n: OPENROUTER PROCESSING\n\n") == []
    events = decoder.feed(b"data: x\n\n")
    assert [e.data for e in events] == ["x"]


def test_multiline_data_is_joined_with_newline() -> None:
    events = SseDecoder().feed(b"data: a\ndata: b\n\n")
    assert [e.data for e in events] == ["a\nb"]


def test_lenient_profile_accepts_null_finish_without_done() -> None:
    result = parse_stream([chunk("a") + chunk("b")], profile="lenient_finish_null")
    assert (result.content, result.finish_reason) == ("ab", "stop")


def test_lenient_profile_still_rejects_errors_and_empty_streams() -> None:
    with pytest.raises(SseAnomaly) as info:
        parse_stream([chunk("a") + b'data: {"error": "x"}\n\n'], profile="lenient_finish_null")
    assert info.value.reason == "error_payload"
    with pytest.raises(SseAnomaly) as info:
        parse_stream([b""], profile="lenient_finish_null")
    assert info.value.reason == "truncated_no_done"


def test_unknown_profile_is_refused_with_the_known_names() -> None:
    with pytest.raises(ValueError, match="strict"):
        get_profile("loose")
    assert set(PROFILES) == {"strict", "lenient_finish_null"}


def test_accumulator_reports_text_bearing_events() -> None:
    acc = StreamAccumulator(get_profile("strict"))
    role_only = json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    assert acc.feed(role_only) is False
    assert acc.feed(json.dumps({"choices": [{"index": 0, "delta": {"content": "x"}}]})) is True
    assert acc.text_events == 1


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(data[last:p])
        last = p
    pieces.append(data[last:])
    return pieces


tokens_st = st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=8)


@given(
    tokens=tokens_st,
    cuts=st.lists(st.integers(min_value=0), max_size=12),
    crlf=st.booleans(),
    keepalive=st.booleans(),
)
def test_any_chunking_and_framing_gives_the_same_answer(
    tokens: list[str], cuts: list[int], crlf: bool, keepalive: bool
) -> None:
    body = stream(tokens)
    if keepalive:
        body = body.replace(b"\n\ndata", b"\n\n: keep-alive\n\ndata")
    if crlf:
        body = body.replace(b"\n", b"\r\n")
    assert parse_stream(_split(body, cuts)).content == "".join(tokens)


@given(tokens=tokens_st, cut=st.integers(min_value=0))
def test_any_cut_before_the_done_line_is_an_anomaly(tokens: list[str], cut: int) -> None:
    body = stream(tokens)
    done_end = len(body) - 2  # end of "data: [DONE]" before its blank line
    prefix = body[: cut % done_end]
    with pytest.raises(SseAnomaly):
        parse_stream([prefix])
    assert parse_stream([body[:done_end]]).content == "".join(tokens)


def test_crlf_split_between_chunks_is_one_line_break() -> None:
    decoder = SseDecoder()
    events = decoder.feed(b"data: a\r") + decoder.feed(b"\ndata: b\r\n\r\n")
    assert [e.data for e in events] == ["a\nb"]


line_st = st.text(st.characters(blacklist_characters="\r\n", codec="utf-8"), max_size=6)


@given(
    events=st.lists(st.lists(line_st, min_size=1, max_size=3), min_size=1, max_size=5),
    newline=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0), max_size=10),
)
def test_decoder_is_chunking_and_newline_invariant(
    events: list[list[str]], newline: str, cuts: list[int]
) -> None:
    text = "".join(
        "".join(f"data: {line}{newline}" for line in lines) + f": ping{newline}{newline}"
        for lines in events
    )
    decoder = SseDecoder()
    got = [e.data for piece in _split(text.encode(), cuts) for e in decoder.feed(piece)]
    got += [e.data for e in decoder.end()]
    assert got == ["\n".join(lines) for lines in events]


sse_line_st = st.one_of(
    st.builds("data: {}".format, line_st),
    st.builds("data:{}".format, line_st),
    st.builds("event: {}".format, line_st),
    st.builds(": {}".format, line_st),
    st.just(""),
    line_st,
)


def _decoded(pieces: Sequence[bytes], max_line_chars: int) -> list[tuple[str, str]] | str:
    """The events of `pieces` (name, data), or the anomaly's reason."""
    decoder = SseDecoder(max_line_chars)
    try:
        events = [e for piece in pieces for e in decoder.feed(piece)] + decoder.end()
    except SseAnomaly as exc:
        return exc.reason
    return [(e.event, e.data) for e in events]


@given(
    lines=st.lists(st.tuples(sse_line_st, st.sampled_from(["\n", "\r\n", "\r"])), max_size=12),
    bom=st.booleans(),
    cuts=st.lists(st.integers(min_value=0), max_size=6),
    max_line_chars=st.sampled_from([4, 8, 12, 1 << 20]),
)
def test_whole_event_chunks_decode_as_any_other_chunking(
    lines: list[tuple[str, str]], bom: bool, cuts: list[int], max_line_chars: int
) -> None:
    """Chunks that each hold one whole `data: ...` event (the decoder's fast path) give the
    events, or the anomaly, that feeding the same bytes one at a time gives."""
    text = "".join(line + newline for line, newline in lines)
    raw = ("\ufeff" if bom else "") + text
    data = raw.encode()
    at_events = [len(raw[:i].encode()) for i in range(len(raw)) if raw.startswith("data: ", i)]
    whole_events = _split(data, at_events + cuts)
    one_byte = [data[i : i + 1] for i in range(len(data))]
    assert _decoded(whole_events, max_line_chars) == _decoded(one_byte, max_line_chars)


@pytest.mark.parametrize(
    ("pieces", "max_line_chars"),
    [
        ([b"event: x\n", b"data: a\n\n"], 99),  # an event name held from the chunk before
        ([b"data: a\n", b"data: b\n\n"], 99),  # a data line held from the chunk before
        ([b"data: a", b"data: b\n\n"], 99),  # a line piece held
        ([b"data: a\r", b"data: b\n\n"], 99),  # a CR held: maybe half of a CRLF
        ([b"data: a\rb\n\n"], 99),  # a CR inside: two lines, the second a field "b"
        ([b"data: abc\n\n"], 8),  # a line longer than the bound
        ([b"data: a\n\n", b"data: b\n\n"], 99),
    ],
)
def test_whole_event_chunks_after_held_state_or_odd_ones(
    pieces: list[bytes], max_line_chars: int
) -> None:
    one_byte = [bytes([b]) for b in b"".join(pieces)]
    assert _decoded(pieces, max_line_chars) == _decoded(one_byte, max_line_chars)


@pytest.mark.parametrize("data", [' {"choices": []}', '{"choices": []}\n ', "\t{}"])
def test_json_data_with_whitespace_around_it_is_decoded(data: str) -> None:
    assert StreamAccumulator(get_profile("strict")).feed(data) is False


@pytest.mark.parametrize("data", ['{"choices": []} x', '{"choices": []}{}', "{", "", " "])
def test_json_data_with_anything_else_is_malformed(data: str) -> None:
    with pytest.raises(SseAnomaly) as caught:
        StreamAccumulator(get_profile("strict")).feed(data)
    assert caught.value.reason == "malformed_json"
