"""Fuzzing the SSE path: generated bodies through the real client against a real loopback server.

Each body is generated as a structure (events, each with what it means) and rendered to bytes with
random line endings, comments, junk fields, invalid UTF-8, huge lines, missing or duplicated
`[DONE]`, then delivered in random pieces. `_oracle` decides from the structure alone what a
strict client must do; the client (and a real cache) must agree: a typed error or a complete
answer, and a cache entry exactly when a complete `stop` answer came back.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import event as label
from hypothesis import strategies as st
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from trm_llm.cache import CachedResponse, ResponseCache
from trm_llm.client import ChatResult, GovernedLLMClient
from trm_llm.errors import LLMError, RetriesExhausted, SseAnomaly
from trm_llm.redis_cache import RedisResponseCache
from trm_llm.retry import RetryPolicy
from trm_llm.simulated_server import Reply, SimulatedServer
from trm_llm.sqlite_cache import SqliteResponseCache
from trm_llm.sse import parse_stream

MODEL = "fuzz-model"
HUGE = "x" * 100_000
INVALID_UTF8 = (b"\xff", b"\xfe", b"\x80", b"\xc0\xaf", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90")

Kind = Literal["chunk", "done", "noop", "error", "malformed"]
Segment = str | bytes  # text, or raw bytes that are not UTF-8


def _short(value: Segment) -> Segment:
    """`value`, or its first 100 characters or bytes when it is longer than 120."""
    if len(value) <= 120:
        return value
    more = f"...({len(value)} long)"
    if isinstance(value, bytes):
        return value[:100] + more.encode()
    return value[:100] + more


@dataclass(frozen=True, repr=False)
class Choice:
    """One choice of a chunk: what it adds to the answer."""

    index: int
    content: tuple[Segment, ...] | None
    reasoning: str
    reasoning_key: str
    finish: str | None

    def __repr__(self) -> str:  # a 100 KB content stays readable in a failure report
        content = None if self.content is None else [_short(s) for s in self.content]
        return (
            f"Choice({self.index}, {content!r}, {self.reasoning!r}, {self.reasoning_key!r}, "
            f"{self.finish!r})"
        )


@dataclass(frozen=True, repr=False)
class Event:
    """One generated SSE event: its meaning for the oracle and its data lines."""

    kind: Kind
    data: tuple[bytes, ...]
    name: str | None = None
    choices: tuple[Choice, ...] = ()

    def __repr__(self) -> str:  # huge lines stay readable in a failure report
        data = [_short(d) for d in self.data]
        return f"Event({self.kind!r}, {data!r}, name={self.name!r}, choices={self.choices!r})"


@dataclass(frozen=True)
class Body:
    """A whole generated body: the dispatched events, what trails them, and the bytes."""

    events: tuple[Event, ...]
    tail: Literal["none", "unframed_done", "partial"]
    raw: bytes = field(repr=False)
    cuts: tuple[int, ...] = ()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # hypothesis: use the short reprs of Event and Choice

    def pieces(self) -> list[bytes]:
        """The body cut at `cuts`: how it is delivered."""
        bounds = [0, *self.cuts, len(self.raw)]
        return [self.raw[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@dataclass(frozen=True)
class Expected:
    """The oracle's verdict: `reason` None means a complete answer with these fields."""

    reason: str | None
    content: str = ""
    reasoning: str | None = None
    finish: str = ""
    either: bool = False  # an `event: error` after [DONE]: error_payload is a sound verdict too


def _text(segments: tuple[Segment, ...] | None) -> str:
    if not segments:
        return ""
    raw = b"".join(s if isinstance(s, bytes) else s.encode() for s in segments)
    return raw.decode("utf-8", errors="replace")


def _oracle(body: Body) -> Expected:
    """What a strict client must conclude, decided from the generated structure only."""
    done = False
    errored_after_done = False
    finishes: dict[int, str | None] = {}
    content: dict[int, list[str]] = {}
    reasoning: dict[int, list[str]] = {}
    dispatched = list(body.events)
    if body.tail == "unframed_done":
        dispatched.append(Event("done", (b"[DONE]",)))
    for event in dispatched:
        if event.name == "error":
            if not done:
                return Expected("error_payload")
            errored_after_done = True
            continue
        if done:
            continue
        if event.kind == "done":
            done = True
        elif event.kind == "error":
            return Expected("error_payload")
        elif event.kind == "malformed":
            return Expected("malformed_json")
        for choice in event.choices:
            if choice.finish is not None or choice.index not in finishes:
                finishes[choice.index] = choice.finish
            content.setdefault(choice.index, []).append(_text(choice.content))
            reasoning.setdefault(choice.index, []).append(choice.reasoning)
    if not done or not finishes or None in finishes.values():
        return Expected("truncated_no_done", either=errored_after_done)
    first = min(finishes)
    finish = finishes[first]
    assert finish is not None
    return Expected(
        None,
        content="".join(content[first]),
        reasoning="".join(reasoning[first]) or None,
        finish=finish,
        either=errored_after_done,
    )


# -- strategies -------------------------------------------------------------------------------

_line_text = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"))
_any_text = st.text(st.characters(codec="utf-8"), max_size=12)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _any_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_any_text, inner, max_size=3),
    max_leaves=8,
)
_FINISHES = st.sampled_from([None, None, "stop", "stop", "length", "tool_calls", "content_filter"])


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def _string(segments: tuple[Segment, ...] | None) -> bytes:
    """A JSON string whose raw bytes may hold invalid UTF-8 (text parts escaped, bytes as is)."""
    if segments is None:
        return b"null"
    parts = [s if isinstance(s, bytes) else _json(s)[1:-1] for s in segments]
    return b'"' + b"".join(parts) + b'"'


def _choice_json(choice: Choice) -> bytes:
    delta = b'{"role":"assistant","content":' + _string(choice.content)
    if choice.reasoning:
        delta += b',"' + choice.reasoning_key.encode() + b'":' + _json(choice.reasoning)
    delta += b"}"
    return b'{"index":%d,"delta":%s,"finish_reason":%s}' % (
        choice.index,
        delta,
        _json(choice.finish),
    )


def _chunk(
    choices: list[Choice], *, usage: bool = False, split: bool = False, name: str | None = None
) -> Event:
    """A chat-completion chunk; `split` spreads its JSON over several `data:` lines."""
    obj = b'{"object":"chat.completion.chunk","model":"m","choices":['
    obj += (b",\n" if split else b",").join(_choice_json(c) for c in choices) + b"]"
    if usage:
        obj += b',"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}'
    return Event("chunk", tuple((obj + b"}").split(b"\n")), name, tuple(choices))


DONE = Event("done", (b"[DONE]",))

_choice = st.builds(
    Choice,
    index=st.sampled_from([0, 0, 0, 1, 2]),
    content=st.none() | st.lists(_any_text | st.sampled_from(INVALID_UTF8), max_size=4).map(tuple),
    reasoning=st.sampled_from(["", "", "hmm "]) | _any_text,
    reasoning_key=st.sampled_from(["reasoning_content", "reasoning"]),
    finish=_FINISHES,
)
_chunks = st.builds(
    _chunk,
    st.lists(_choice, max_size=3),
    usage=st.booleans(),
    split=st.booleans(),
    name=st.sampled_from([None, None, "message", "completion"]),
)
_noops = st.dictionaries(
    _any_text.filter(lambda k: k not in {"choices", "error", "object"}), _json_values, max_size=4
).map(lambda d: Event("noop", (_json(d),)))
_errors = st.one_of(
    # {"error": null} is no error payload (issue 15.7): a chunk without choices, a no-op.
    _json_values.map(
        lambda v: Event("error" if v is not None else "noop", (b'{"error":' + _json(v) + b"}",))
    ),
    _any_text.map(lambda m: Event("error", (b'{"object":"error","message":' + _json(m) + b"}",))),
    st.sampled_from(["error", "abort"]).map(
        lambda f: Event("error", _chunk([Choice(0, ("par",), "", "reasoning", f)]).data)
    ),
    st.one_of(_chunks, _noops).map(lambda e: Event("noop", e.data, "error")),
)
_BAD_SHAPES = [
    b'{"choices":"abc"}',
    b'{"choices":5}',
    b'{"choices":null}',
    b'{"choices":{"a":1}}',
    b'{"choices":[5]}',
    b'{"choices":[null]}',
    b'{"choices":[[]]}',
    b'{"choices":[{"index":"0"}]}',
    b'{"choices":[{"index":1.0}]}',
    b'{"choices":[{"index":true}]}',
    b'{"choices":[{"index":null}]}',
    b'{"choices":[{"delta":"x"}]}',
    b'{"choices":[{"delta":[1]}]}',
    b'{"choices":[{"finish_reason":1}]}',
    b'{"choices":[{"finish_reason":true}]}',
    b'{"choices":[{"finish_reason":[]}]}',
    b'{"choices":[{"finish_reason":{}}]}',
    b'{"choices":[{"finish_reason":["stop"]}]}',
]
_line_bytes = st.binary(max_size=24).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))


@st.composite
def _truncated(draw: st.DrawFn) -> Event:
    whole = b"".join(draw(_chunks).data)
    return Event("malformed", (whole[: draw(st.integers(1, len(whole) - 1))],))


_malformed = st.one_of(
    _line_bytes.map(lambda b: Event("malformed", (b"not json " + b,))),
    _truncated(),
    _json_values.filter(lambda v: not isinstance(v, dict)).map(
        lambda v: Event("malformed", (_json(v),))
    ),
    st.sampled_from(_BAD_SHAPES).map(lambda b: Event("malformed", (b,))),
    st.just(100_000).map(lambda n: Event("malformed", (b"[" * n + b"]" * n,))),  # deep JSON
)
_events = st.one_of(_chunks, _chunks, _chunks, st.just(DONE), _noops, _errors, _malformed)
_junk = st.one_of(
    _line_bytes.map(lambda b: b":" + b),  # a comment
    st.tuples(_line_text.filter(bool), _line_bytes)
    .filter(lambda t: t[0].partition(":")[0] not in {"data", "event"})
    .map(lambda t: t[0].encode() + t[1]),  # a field trm does not know, or no field at all
)
_ENDINGS = [b"\n", b"\r\n", b"\r"]
_TAILS: list[Literal["none", "unframed_done", "partial"]] = [
    "none",
    "none",
    "unframed_done",
    "partial",
]


@st.composite
def _structure(draw: st.DrawFn, huge: bool) -> list[Event]:
    """A mostly well-formed answer ("clean") or any sequence of events ("wild")."""
    if draw(st.sampled_from(["clean", "clean", "wild"])) == "wild":
        events = draw(st.lists(_events, max_size=8))
    else:
        events = draw(st.lists(_chunks, max_size=4))
        if draw(st.integers(0, 4)) > 0:  # usually: finish every choice that was streamed
            seen = sorted({c.index for e in events for c in e.choices} or {0})
            reasons = st.sampled_from(["stop", "stop", "length"])
            events.append(_chunk([Choice(i, None, "", "reasoning", draw(reasons)) for i in seen]))
        if draw(st.booleans()):
            events.append(_chunk([], usage=True))  # a usage-only last chunk
        events += [DONE] * draw(st.sampled_from([0, 1, 1, 1, 2]))
    if huge and draw(st.integers(0, 9)) == 0:
        at = draw(st.integers(0, len(events)))
        events.insert(at, _chunk([Choice(0, (HUGE,), "", "reasoning", None)]))
    return events


@st.composite
def bodies(draw: st.DrawFn, huge: bool = True) -> Body:
    """A generated body: structure, noise between its lines, random line endings and tail."""
    events = draw(_structure(huge))
    noise = st.lists(_junk, max_size=2)
    if huge and draw(st.integers(0, 14)) == 0:
        noise = noise | st.just(100_000).map(lambda n: [b": " + b"k" * n])  # a huge comment line
    lines: list[bytes] = []
    for event in events:
        lines += draw(noise)
        if event.name is not None:
            lines.append(b"event:" + draw(st.sampled_from([b" ", b""])) + event.name.encode())
        for data in event.data:
            lines += draw(noise) if draw(st.integers(0, 3)) == 0 else []
            lines.append(draw(st.sampled_from([b"data: ", b"data:"])) + data)
        lines += [b""] * draw(st.integers(1, 2))
    tail = draw(st.sampled_from(_TAILS))
    if tail == "unframed_done":
        lines += [*draw(noise), b"data: [DONE]", *draw(noise)]
    elif tail == "partial":
        lines += [b"data: " + data for data in draw(_chunks).data]
    raw = b""
    previous = b""
    for n, line in enumerate(lines):
        ending = draw(st.sampled_from(_ENDINGS))
        if previous == b"\r" and not line and ending == b"\n":
            ending = b"\r\n"  # CR then LF is one line ending, not two
        if n == len(lines) - 1 and tail != "none" and draw(st.booleans()):
            ending = b""  # the body stops without ending its last line
        raw += line + ending
        previous = ending
    cuts = draw(st.lists(st.integers(0, len(raw)), max_size=12, unique=True))
    return Body(tuple(events), tail, raw, tuple(sorted(cuts)))


def _simple(*events: Event, tail: Literal["none", "unframed_done"] = "none") -> Body:
    """A body with plain framing, for the explicit examples."""
    raw = b"".join(
        (b"event: " + e.name.encode() + b"\n" if e.name else b"")
        + b"".join(b"data: " + d + b"\n" for d in e.data)
        + b"\n"
        for e in events
    )
    return Body(events, tail, raw + (b"data: [DONE]" if tail == "unframed_done" else b""))


STOP = _chunk([Choice(0, ("Hi",), "", "reasoning", "stop")])
LLAMA_CPP = _simple(STOP, tail="unframed_done")
UNHASHABLE_FINISH = _simple(
    Event("malformed", (b'{"choices":[{"index":0,"finish_reason":[]}]}',)), DONE
)
DEEP_JSON = _simple(Event("malformed", (b"[" * 100_000 + b"]" * 100_000,)), DONE)
ERROR_AFTER_DONE = _simple(STOP, DONE, Event("noop", (b"{}",), "error"))


# -- the properties ---------------------------------------------------------------------------


def _check_parse(body: Body, chunks: list[bytes]) -> None:
    expected = _oracle(body)
    label(f"oracle: {expected.reason or 'complete'}")
    try:
        result = parse_stream(chunks)
    except SseAnomaly as exc:
        assert expected.reason == exc.reason or (expected.either and exc.reason == "error_payload")
        return
    assert expected.reason is None, f"accepted a body the oracle refuses ({expected.reason})"
    got = (result.content, result.reasoning, result.finish_reason)
    assert got == (expected.content, expected.reasoning, expected.finish)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(body=LLAMA_CPP)
@example(body=ERROR_AFTER_DONE)
@example(body=UNHASHABLE_FINISH)
@example(body=DEEP_JSON)
@given(body=bodies(huge=False))
def test_decoder_agrees_with_the_oracle_at_every_byte_boundary(body: Body) -> None:
    """Whole, cut as generated, and one byte per chunk: the same verdict, the oracle's."""
    _check_parse(body, [body.raw])
    _check_parse(body, body.pieces())
    _check_parse(body, [body.raw[i : i + 1] for i in range(len(body.raw))])


# -- through the real client and a real cache -------------------------------------------------

CacheFactory = Callable[[], tuple[ResponseCache, Callable[[], Awaitable[None]]]]
Ending = Literal["complete", "drop", "reset"]
_MID_STREAM = frozenset({"error_payload", "malformed_json"})  # seen before the body ends


@dataclass(frozen=True)
class Outcome:
    """What one `chat()` did, and what the cache and the server saw."""

    result: ChatResult | LLMError
    requests: int
    stored: CachedResponse | None
    again: ChatResult | None
    requests_after: int


async def _no_sleep(_: float) -> None:
    return None


async def _nothing() -> None:
    return None


class Loopback:
    """The module's server, with a short repr (hypothesis prints fixtures of a failing test)."""

    def __init__(self, server: SimulatedServer) -> None:
        self.server = server

    def __repr__(self) -> str:
        return f"Loopback({self.server.base_url!r})"


@pytest.fixture(scope="module")
def server() -> Iterator[Loopback]:
    """One loopback server for the module; each example sets the reply it sends."""
    srv = SimulatedServer()
    stop = srv.run_in_thread()
    try:
        yield Loopback(srv)
    finally:
        stop()


def _reply(body: Body, ending: Ending, pause_every: int) -> Reply:
    steps: list[bytes | float] = []
    for n, piece in enumerate(body.pieces()):
        if steps and pause_every and n % pause_every == 0:
            steps.append(0.0005)  # let the client read what came so far on its own
        steps.append(piece)
    return Reply(steps=tuple(steps), ending=ending)


def _call(loopback: Loopback, reply: Reply, attempts: int, make_cache: CacheFactory) -> Outcome:
    server = loopback.server
    server.default = reply

    async def go() -> Outcome:
        cache, close = make_cache()
        messages = [{"role": "user", "content": uuid.uuid4().hex}]
        retry = RetryPolicy(max_attempts=attempts, base_delay_s=0.0)
        try:
            async with GovernedLLMClient(
                server.base_url, MODEL, cache=cache, retry=retry, sleep=_no_sleep
            ) as client:
                before = server.request_count
                result: ChatResult | LLMError
                try:
                    result = await client.chat(messages)
                except LLMError as exc:
                    result = exc
                requests = server.request_count - before
                key = cache.build_key(MODEL, messages, None, {}, endpoint=client.base_url)
                stored = await cache.get(key)
                again = await client.chat(messages) if stored is not None else None
                after = server.request_count - before - requests
        finally:
            await close()
        return Outcome(result, requests, stored, again, after)

    return asyncio.run(go())


def _kind(error: BaseException) -> str:
    if isinstance(error, SseAnomaly):
        return error.reason
    if isinstance(error, httpx.TransportError):
        return "transport"
    raise AssertionError(f"unexpected last error {error!r}")


def _acceptable_errors(expected: Expected, ending: Ending) -> set[str]:
    """The failures a strict client may report for this body and connection ending."""
    also = {"error_payload"} if expected.either else set()
    if ending == "complete":
        return also if expected.reason is None else {expected.reason} | also
    if expected.reason in _MID_STREAM:  # usually read before the cut is noticed, not always
        return {expected.reason, "transport"}
    return {"transport"} | also


def _check_call(body: Body, ending: Ending, attempts: int, outcome: Outcome) -> None:
    expected = _oracle(body)
    label(f"oracle: {expected.reason or 'complete'}, ending: {ending}")
    result = outcome.result
    if isinstance(result, ChatResult):
        assert ending == "complete" and expected.reason is None, (
            f"returned an answer the oracle refuses ({expected.reason}, ending {ending})"
        )
        got = (result.content, result.reasoning, result.finish_reason)
        assert got == (expected.content, expected.reasoning, expected.finish)
        assert (result.attempts, result.cached, outcome.requests) == (1, False, 1)
        assert (outcome.stored is not None) == (result.finish_reason == "stop")
        if outcome.stored is not None:
            assert outcome.again is not None and outcome.again.cached
            stored = (outcome.stored.content, outcome.stored.reasoning)
            assert (
                stored
                == (result.content, result.reasoning)
                == (
                    outcome.again.content,
                    outcome.again.reasoning,
                )
            )
            assert outcome.requests_after == 0, "a cache hit went to the server"
        return
    assert isinstance(result, RetriesExhausted), f"{result!r}"
    assert (result.why, result.attempts, outcome.requests) == ("attempts", attempts, attempts)
    assert outcome.stored is None, "an incomplete answer was cached"
    assert _kind(result.last_error) in _acceptable_errors(expected, ending)


_endings = st.sampled_from(["complete", "complete", "complete", "drop", "reset"])
_FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def sqlite_cache(tmp_path_factory: pytest.TempPathFactory) -> CacheFactory:
    path: Path = tmp_path_factory.mktemp("fuzz-cache") / "cache.db"
    return lambda: (SqliteResponseCache(path, ttl_s=3600, namespace="fuzz"), _nothing)


@_FUZZ
@example(body=LLAMA_CPP, ending="complete", attempts=1, pause_every=0)
@example(body=ERROR_AFTER_DONE, ending="complete", attempts=1, pause_every=0)
@example(body=UNHASHABLE_FINISH, ending="complete", attempts=1, pause_every=0)
@example(body=DEEP_JSON, ending="complete", attempts=1, pause_every=0)
@given(
    body=bodies(),
    ending=_endings,
    attempts=st.integers(1, 3),
    pause_every=st.integers(0, 3),
)
def test_client_returns_complete_answers_or_typed_errors_sqlite_cache(
    server: Loopback,
    sqlite_cache: CacheFactory,
    body: Body,
    ending: Ending,
    attempts: int,
    pause_every: int,
) -> None:
    """Only LLMErrors escape; an answer is the oracle's; only a complete `stop` is cached."""
    outcome = _call(server, _reply(body, ending, pause_every), attempts, sqlite_cache)
    _check_call(body, ending, attempts, outcome)


@pytest.fixture
def redis_cache() -> Iterator[CacheFactory]:
    """A Redis cache under a namespace of its own, whose keys are deleted afterwards."""
    namespace = f"trm-fuzz:{uuid.uuid4().hex}"

    def make() -> tuple[ResponseCache, Callable[[], Awaitable[None]]]:
        redis = Redis(host="127.0.0.1", port=6379)
        return RedisResponseCache(redis, ttl_s=3600, namespace=namespace), redis.aclose

    yield make
    admin = SyncRedis(host="127.0.0.1", port=6379)
    try:
        names = list(admin.scan_iter(match=f"{namespace}:*"))
        if names:
            admin.delete(*names)
    finally:
        admin.close()


@pytest.mark.redis
@settings(
    _FUZZ,
    max_examples=40,
    suppress_health_check=[*_FUZZ.suppress_health_check, HealthCheck.function_scoped_fixture],
)
@given(body=bodies(), ending=_endings, attempts=st.integers(1, 2))
def test_client_returns_complete_answers_or_typed_errors_redis_cache(
    server: Loopback, redis_cache: CacheFactory, body: Body, ending: Ending, attempts: int
) -> None:
    """The same property with the shared Redis cache."""
    outcome = _call(server, _reply(body, ending, 2), attempts, redis_cache)
    _check_call(body, ending, attempts, outcome)


# -- hostile server behaviours through chat(), with a cache and the real store sink -----------
# Issue 15.5/15.6: whatever the status, the headers and the payload values, chat() returns a
# complete answer or raises an LLMError, and the call's one event is in the store.


def _escaped(value: Any) -> bytes:
    """JSON with every non-ASCII character escaped: lone UTF-16 halves travel as `\\udXXX`."""
    return json.dumps(value).encode()


_STATUSES = st.sampled_from([200] * 8 + [201, 204, 400, 401, 404, 429, 500, 503, 599, 600, 799])
_CONTENT_TYPES = st.sampled_from(
    ["text/event-stream"] * 4
    + [
        "Text/Event-Stream",
        "text/event-stream; charset=utf-8",
        "application/json",
        "",
        "text/plain",
    ]
)
_ENCODINGS = st.sampled_from([None] * 4 + ["gzip", "deflate", "identity", "br", "x-unknown"])
_HOSTILE_TEXT = st.one_of(
    _any_text,
    st.sampled_from(["\x00", "stop\x00", "x" * 300, "\ud83d", "\ude00", "\u2028", "\ufeff"]),
)
_HOSTILE_NUMBERS = st.sampled_from(
    [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"9223372036854775808", b"-1", b"1.5", b"0"]
)


@st.composite
def _hostile_usage(draw: st.DrawFn) -> bytes:
    fields = [
        b'"' + name.encode() + b'":' + draw(_HOSTILE_NUMBERS)
        for name in draw(st.sets(st.sampled_from(["prompt_tokens", "total_tokens", "x"])))
    ]
    if draw(st.booleans()):
        fields.append(b'"note":' + _escaped(draw(_HOSTILE_TEXT)))
    depth = draw(st.sampled_from([0, 0, 3, 5, 400]))
    inner = b"{" + b",".join(fields) + b"}"
    return b'{"d":' * depth + inner + b"}" * depth


@st.composite
def _hostile_payloads(draw: st.DrawFn) -> list[bytes]:
    """The data payloads of one stream: content (surrogate halves, NUL), a finish, usage."""
    payloads: list[bytes] = []
    for text in draw(st.lists(_HOSTILE_TEXT, min_size=0, max_size=4)):
        delta = b'{"content":' + _escaped(text) + b"}"
        payloads.append(b'{"choices":[{"index":0,"delta":' + delta + b',"finish_reason":null}]}')
    if draw(st.booleans()):
        payloads.append(b'{"error":null,"choices":[]}')
    finish = draw(st.sampled_from(["stop", "stop", "length", "error"]) | _HOSTILE_TEXT)
    usage = b',"usage":' + draw(_hostile_usage()) if draw(st.booleans()) else b""
    end = b'{"choices":[{"index":0,"delta":{},"finish_reason":' + _escaped(finish) + b"}]" + usage
    payloads.append(end + b"}")
    if draw(st.integers(0, 4)):
        payloads.append(b"[DONE]")
    return payloads


@st.composite
def hostile_replies(draw: st.DrawFn) -> Reply:
    headers = [("Content-Type", draw(_CONTENT_TYPES))]
    encoding = draw(_ENCODINGS)
    if encoding is not None:
        headers.append(("Content-Encoding", encoding))
    body = b"\xef\xbb\xbf" if draw(st.booleans()) else b""
    body += b"".join(b"data: " + p + b"\n\n" for p in draw(_hostile_payloads()))
    cut = draw(st.integers(1, max(1, len(body))))
    steps = (body[:cut], body[cut:]) if draw(st.booleans()) else (body,)
    ending = draw(st.sampled_from(["complete", "complete", "complete", "drop"]))
    return Reply(status=draw(_STATUSES), headers=tuple(headers), steps=steps, ending=ending)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, SqliteResponseCache]]:
    from trm_llm.sink import StoreEventSink
    from trm_store import open_store

    root = tmp_path_factory.mktemp("fuzz-hostile")
    with open_store(f"sqlite:///{root / 'trm.db'}") as store:
        sink = StoreEventSink(store)
        yield store, SqliteResponseCache(root / "cache.db", ttl_s=3600, sink=sink)
        sink.close()


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(reply=hostile_replies(), attempts=st.integers(1, 2))
def test_hostile_server_behaviours_give_answers_or_llm_errors_and_always_an_event(
    server: Loopback, recorded: tuple[Any, SqliteResponseCache], reply: Reply, attempts: int
) -> None:
    from trm_llm.sink import StoreEventSink

    store, cache = recorded
    server.server.default = reply
    label(f"status {reply.status}, {dict(reply.headers).get('Content-Encoding')}")

    async def go() -> tuple[ChatResult | LLMError, ChatResult | None]:
        messages = [{"role": "user", "content": uuid.uuid4().hex}]
        # Each example's sink is closed: its writer thread ends and gives its connection back.
        async with (
            StoreEventSink(store) as sink,
            GovernedLLMClient(
                server.server.base_url,
                MODEL,
                cache=cache,
                sink=sink,
                retry=RetryPolicy(max_attempts=attempts, base_delay_s=0.0, deadline_s=20.0),
                sleep=_no_sleep,
                first_token_timeout_s=5.0,
                inter_token_timeout_s=5.0,
            ) as client,
        ):
            try:
                result: ChatResult | LLMError = await client.chat(messages)
            except LLMError as exc:  # anything else fails the test
                return exc, None
            again = await client.chat(messages) if result.finish_reason == "stop" else None
            return result, again

    head = store.head_position()
    result, again = asyncio.run(go())
    calls = [
        e
        for e in store.read_all(after_position=head)
        if e.type in {"llm.call_completed", "llm.call_failed"}
    ]
    label("answer" if isinstance(result, ChatResult) else type(result).__name__)
    if isinstance(result, ChatResult):
        assert result.finish_reason not in {"error", "abort"}
        assert calls[0].type == "llm.call_completed"
        assert calls[0].data["call_id"] == result.call_id
        if again is not None:  # a complete stop answer was cached, and is served whole
            assert again.cached and again.content == result.content
            assert len(calls) == 2
        else:
            assert len(calls) == 1
    else:
        assert [e.type for e in calls] == ["llm.call_failed"], "a failed call went unrecorded"
