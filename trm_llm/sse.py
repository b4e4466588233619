"""Pure SSE decoding and the completeness check of a chat-completion stream (no I/O).

`SseDecoder` turns bytes into events as the SSE spec frames them (a leading BOM dropped, lines
bounded by `MAX_LINE_CHARS`), with one deliberate exception:
an unframed `data: [DONE]` at the very end of the body (llama.cpp's server sends no blank line
after it) is still dispatched, because httpx-sse's decoder only dispatches on a blank line and
would lose it. Any other unframed trailing event is dropped, as the spec says.
`StreamAccumulator` folds data payloads into an answer and raises `SseAnomaly` as soon as an
error shape appears; `finish()` raises unless the stream is complete under the profile.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from httpx_sse import ServerSentEvent

from trm_llm.errors import LLMConfigError, SseAnomaly
from trm_llm.sanitise import repair_text

__all__ = [
    "ERROR_FINISHES",
    "MAX_LINE_CHARS",
    "PROFILES",
    "SseDecoder",
    "SseProfile",
    "StreamAccumulator",
    "StreamResult",
    "get_profile",
    "parse_stream",
]

DONE = "[DONE]"
MAX_LINE_CHARS = 8 * 1024 * 1024
"""The longest line (or event data) a stream may hold, in characters: 8 Mi."""
ERROR_FINISHES = frozenset({"error", "abort"})
"""Finish reasons that mark a failed answer: never complete, never cached, never served."""


@dataclass(frozen=True)
class SseProfile:
    """A server dialect: what a complete stream must show. "strict" is the default."""

    name: str
    require_done: bool = True
    require_finish_reason: bool = True


PROFILES: dict[str, SseProfile] = {
    "strict": SseProfile("strict"),
    # Servers that end a complete answer with finish_reason null and no [DONE]: a clean end of
    # body counts as finish "stop". Only for servers known to speak this way.
    "lenient_finish_null": SseProfile(
        "lenient_finish_null", require_done=False, require_finish_reason=False
    ),
}


def get_profile(name: str) -> SseProfile:
    """Look a profile up by name; an unknown name is refused with the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise LLMConfigError(f"unknown SSE profile {name!r}; known: {sorted(PROFILES)}") from None


@dataclass(frozen=True)
class StreamResult:
    """A complete answer: choice 0's text, apart from its reasoning."""

    content: str
    reasoning: str | None
    finish_reason: str
    usage: dict[str, Any] | None
    model: str | None


class SseDecoder:
    """Bytes in, events out; lines end at CRLF, LF or CR, even when split across chunks.

    A UTF-8 byte order mark at the start of the stream is dropped (the SSE spec says so). A line,
    or an event's data, longer than `max_line_chars` raises `SseAnomaly("line_too_long")` as soon
    as that many characters are held: an unbounded line can neither exhaust memory nor cost time
    quadratic in its length (the pieces of a long line are joined once, not once per chunk).
    """

    def __init__(self, max_line_chars: int = MAX_LINE_CHARS) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._started = False  # a first character was decoded: a BOM there has been dropped
        self._max = max_line_chars
        self._pending: list[str] = []  # the pieces of the unfinished last line
        self._pending_chars = 0
        self._held_cr = False  # the last chunk ended in CR: maybe half of a CRLF
        self._event = ""
        self._data: list[str] = []
        self._data_chars = 0

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode one chunk; return the events it completed."""
        text = self._decode(chunk)
        if (  # the usual chunk, one whole event "data: ...\n\n" and nothing held: as `_lines`
            text.startswith("data: ")
            and text.find("\n") == len(text) - 2
            and text.endswith("\n\n")
            and not (self._pending or self._held_cr or self._data or self._event)
            and "\r" not in text
            and len(text) <= self._max
        ):
            return [ServerSentEvent(data=text[6:-2])]
        if not self._held_cr and "\n" not in text and "\r" not in text:
            self._hold(text)  # the middle of a long line: keep the piece, join it later
            return []
        return self._lines(self._split(text))

    def end(self) -> list[ServerSentEvent]:
        """End of body: dispatch a pending unframed `[DONE]`; drop any other pending event."""
        lines = self._split(self._decode(b"", final=True), final=True)
        last = lines.pop()
        events = self._lines(lines)
        if last:
            self._line(last)
        data, self._data, self._event, self._data_chars = self._data, [], "", 0
        return [*events, ServerSentEvent(data=DONE)] if data == [DONE] else events

    def _decode(self, chunk: bytes, final: bool = False) -> str:
        """UTF-8 (bad bytes replaced), a BOM at the very start dropped. Done here, not by the
        "utf-8-sig" codec: that one adds a Python call on every chunk of every stream."""
        text = self._utf8.decode(chunk, final)
        if not self._started and text:
            self._started = True
            if text[0] == "\ufeff":
                return text[1:]
        return text

    def _hold(self, text: str) -> None:
        self._pending_chars += len(text)
        if self._pending_chars > self._max:
            raise SseAnomaly("line_too_long", f"a line longer than {self._max} characters")
        self._pending.append(text)

    def _split(self, text: str, *, final: bool = False) -> list[str]:
        """The complete lines so far, then (if `final`) the unfinished last one; otherwise the
        unfinished last line is held for the next chunk."""
        if self._pending or self._held_cr:
            text = "".join(self._pending) + ("\r" if self._held_cr else "") + text
            self._pending, self._pending_chars, self._held_cr = [], 0, False
        if not final and text.endswith("\r"):
            self._held_cr, text = True, text[:-1]
        lines = _split_lines(text)
        if not final and (last := lines.pop()):
            self._hold(last)
        # No line is longer than the text: the usual chunk skips the look at each line.
        if len(text) > self._max and any(len(line) > self._max for line in lines):
            raise SseAnomaly("line_too_long", f"a line longer than {self._max} characters")
        return lines

    def _lines(self, lines: list[str]) -> list[ServerSentEvent]:
        events: list[ServerSentEvent] = []
        for line in lines:
            if line.startswith("data: "):  # the hot path: one data line of an event
                self._add_data(line[6:])
                continue
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def _add_data(self, value: str) -> None:
        self._data_chars += len(value) + 1
        if self._data_chars > self._max:
            raise SseAnomaly("line_too_long", f"an event longer than {self._max} characters")
        self._data.append(value)

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:
            if not self._data:
                self._event = ""
                return None
            data = self._data[0] if len(self._data) == 1 else "\n".join(self._data)
            event = ServerSentEvent(event=self._event, data=data)
            self._event, self._data, self._data_chars = "", [], 0
            return event
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._add_data(value)
        elif field == "event":
            self._event = value
        return None


class StreamAccumulator:
    """Folds data payloads into an answer; raises `SseAnomaly` on an error shape or bad JSON."""

    def __init__(self, profile: SseProfile) -> None:
        self.profile = profile
        self.done = False
        self.text_events = 0
        self.progress = 0  # events that carried text, a finish_reason or [DONE]
        self._content: dict[int, list[str]] = {}
        self._reasoning: dict[int, list[str]] = {}
        self._finish: dict[int, str | None] = {}
        self._usage: dict[str, Any] | None = None
        self._model: str | None = None
        self._model_raw: str | None = None  # as streamed, before `repair_text`

    def feed_event(self, event: ServerSentEvent) -> bool:
        """Feed one event; a named `error` event is an error payload. Nothing after `[DONE]`
        counts: the answer was complete there."""
        if self.done:
            return False
        if event.event == "error":
            raise SseAnomaly("error_payload", "event: error")
        return self.feed(event.data)

    def feed(self, data: str) -> bool:
        """Feed one data payload; return True if it carried content or reasoning text."""
        if self.done:
            return False
        if data == DONE:
            self.done = True
            self.progress += 1
            return False
        try:
            obj = _json(data)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than Python's stack
            raise SseAnomaly("malformed_json", "data is not JSON") from None
        if not isinstance(obj, dict):
            raise SseAnomaly("malformed_json", "data is not a JSON object")
        if obj.get("error") is not None or obj.get("object") == "error":  # {"error": null} is not
            raise SseAnomaly("error_payload", _short(obj.get("error") or obj.get("message")))
        model = obj.get("model")
        if isinstance(model, str) and model != self._model_raw:  # usually the same each event
            self._model_raw, self._model = model, repair_text(model)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        choices = obj.get("choices", [])
        if not isinstance(choices, list):
            raise SseAnomaly("malformed_json", "choices is not a list")
        carried = False
        for choice in choices:
            carried = self._choice(choice) or carried
        if carried:
            self.text_events += 1
            self.progress += 1
        return carried

    def _choice(self, choice: Any) -> bool:
        if not isinstance(choice, dict):
            raise SseAnomaly("malformed_json", "a choice is not an object")
        delta = choice.get("delta") or {}
        index = choice.get("index", 0)
        finish = choice.get("finish_reason")
        if not isinstance(delta, dict) or type(index) is not int:
            raise SseAnomaly("malformed_json", "a choice has a bad delta or index")
        if finish is None:
            self._finish.setdefault(index, None)
        elif not isinstance(finish, str):
            raise SseAnomaly("malformed_json", "finish_reason is not a string")
        elif finish in ERROR_FINISHES:
            raise SseAnomaly("error_payload", f"finish_reason {finish}")
        else:
            self._finish[index] = finish
            self.progress += 1
        carried = False
        text = delta.get("content")
        if text and isinstance(text, str):
            self._content.setdefault(index, []).append(text)
            carried = True
        # Servers name it reasoning_content (vLLM, DeepSeek) or reasoning (OpenRouter); a proxy
        # that sends both sends the same text twice, so take one.
        text = delta.get("reasoning_content") or delta.get("reasoning")
        if text and isinstance(text, str):
            self._reasoning.setdefault(index, []).append(text)
            carried = True
        return carried

    def finish(self) -> StreamResult:
        """The answer, if the stream is complete under the profile; else `SseAnomaly`."""
        if self.profile.require_done and not self.done:
            raise SseAnomaly("truncated_no_done", "stream ended without [DONE]")
        if not self._finish:
            raise SseAnomaly("truncated_no_done", "no choice was streamed")
        unfinished = sorted(i for i, f in self._finish.items() if f is None)
        if unfinished and self.profile.require_finish_reason:
            raise SseAnomaly("truncated_no_done", f"choices {unfinished} have no finish_reason")
        first = min(self._finish)
        reasoning = self._reasoning.get(first)
        return StreamResult(  # an emoji streamed as two escaped UTF-16 halves is joined here
            content=repair_text("".join(self._content.get(first, []))),
            reasoning=repair_text("".join(reasoning)) if reasoning else None,
            finish_reason=repair_text(self._finish[first] or "stop"),
            usage=self._usage,
            model=self._model,
        )


def parse_stream(chunks: Iterable[bytes], profile: str = "strict") -> StreamResult:
    """Decode and check a whole body given as chunks (the client does the same, with timers)."""
    decoder = SseDecoder()
    acc = StreamAccumulator(get_profile(profile))
    for piece in chunks:
        for event in decoder.feed(piece):
            acc.feed_event(event)
    for event in decoder.end():
        acc.feed_event(event)
    return acc.finish()


_raw_decode = json.JSONDecoder().raw_decode


def _json(data: str) -> Any:
    """`json.loads(data)`, one bare JSON value (every event's data) decoded without its two
    Python calls and two regex matches; anything else (whitespace around the value, text after
    it, not JSON) is left to `json.loads` itself, to decode or refuse as usual."""
    try:
        value, end = _raw_decode(data)
    except ValueError:
        return json.loads(data)
    return value if end == len(data) else json.loads(data)


def _split_lines(text: str) -> list[str]:
    """Split on CRLF, LF or CR only (not on the other characters str.splitlines knows)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.split("\n")


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:200]
