"""Issue 15.1: the API key never leaks, in any form, whatever the key or the server does.

A key that is not a valid header value (CR, LF, CRLF, a space, a tab, a NUL, non-ASCII) is
refused when the client or `LLMSettings` is built, with a typed error that does not hold it;
a valid key echoed back by a hostile server in every form (raw, repr, JSON-escaped,
URL-encoded, truncated) is redacted out of events (a real store sink), log records, exception
messages, args and chains, cache keys and values, and CLI output.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from tests.cli.helpers import TierServer, child_env, trm, write_items
from trm_llm import (
    APIKeyError,
    GovernedLLMClient,
    LLMError,
    LLMSettings,
    LLMSettingsError,
    RetryPolicy,
    SqliteResponseCache,
    StoreEventSink,
)
from trm_llm.api_key import PARTIAL, Redactor, exception_chain
from trm_llm.simulated_server import Reply, SimulatedServer, normal, sse, status
from trm_store import open_store

USER = [{"role": "user", "content": "Say hello."}]


def _key(tail: str = "") -> str:
    return "sk-trm-" + uuid.uuid4().hex + tail


def forms(key: str) -> set[str]:
    """What a leak of `key` may look like: every form, and every PARTIAL-long fragment."""
    out = {key, repr(key)[1:-1], json.dumps(key)[1:-1], quote(key, safe=""), key.strip()}
    body = key.strip()
    out |= {body[i : i + PARTIAL] for i in range(len(body) - PARTIAL + 1)}
    return {f for f in out if f}


def leaks(key: str, texts: Iterable[str]) -> list[str]:
    shapes = forms(key)
    return [t for t in texts if any(s in t for s in shapes)]


def chain_texts(exc: BaseException) -> list[str]:
    """Every message, repr and arg along the cause/context chain, `last_error` included."""
    return [t for e in exception_chain(exc) for t in (str(e), repr(e), *map(repr, e.args))]


HOSTILE_TAILS = {
    "trailing CR": "\r",
    "trailing LF": "\n",
    "trailing CRLF": "\r\n",
    "trailing space": " ",
    "inner tab": "\tx",
    "NUL": "\x00",
    "non-ASCII": "é",
}


@pytest.mark.parametrize("tail", list(HOSTILE_TAILS.values()), ids=list(HOSTILE_TAILS))
@pytest.mark.parametrize("wrap", [str, SecretStr], ids=["str", "SecretStr"])
def test_a_key_that_is_no_header_value_is_refused_when_the_client_is_built(
    tail: str, wrap: type
) -> None:
    key = _key(tail)
    with pytest.raises(APIKeyError) as info:
        GovernedLLMClient("http://127.0.0.1:9", "m", api_key=wrap(key))
    assert isinstance(info.value, LLMError) and isinstance(info.value, ValueError)
    assert "header value" in str(info.value)
    assert leaks(key, chain_texts(info.value)) == []


@pytest.mark.parametrize("tail", list(HOSTILE_TAILS.values()), ids=list(HOSTILE_TAILS))
def test_a_key_that_is_no_header_value_is_refused_by_the_settings(tail: str) -> None:
    key = _key(tail)
    with pytest.raises(LLMSettingsError) as info:
        LLMSettings(llm_base_url="http://127.0.0.1:9", llm_model="m", llm_api_key=key)
    assert "LLM_API_KEY" in str(info.value)
    assert leaks(key, chain_texts(info.value)) == []


@pytest.mark.parametrize("tail", ["\r", "\n", " ", "é"], ids=["CR", "LF", "space", "non-ASCII"])
def test_cli_output_never_shows_a_hostile_key(tmp_path: Path, tail: str) -> None:
    key = _key(tail)
    srv = TierServer()
    stop = srv.run_in_thread()
    try:
        items = write_items(tmp_path / "i.jsonl", [{"question_id": "q1", "question": "[[say:A]]"}])
        db = f"sqlite:///{tmp_path / 'trm.db'}"
        args = ["diagnose", "--run-id", "r1", "--items", str(items), "--db", db]
        args += ["--base-url", srv.base_url, "--model", "sim"]
        done = trm(*args, cwd=tmp_path, env=child_env(tmp_path, LLM_API_KEY=key))
    finally:
        stop()
    assert done.returncode == 2, done.stderr
    assert "LLM_API_KEY" in done.stderr and "header value" in done.stderr
    assert leaks(key, [done.stdout, done.stderr]) == []
    assert srv.request_count == 0


def _echoes(key: str) -> list[str]:
    return [
        f"Incorrect API key provided: {key}",
        f"key={key!r}",
        json.dumps({"auth": f"Bearer {key}"}),
        f"url-encoded {quote(key, safe='')}",
        f"truncated {key[:14]}... and its end ...{key[-PARTIAL:]}",
    ]


def _hostile_server_replies(key: str) -> list[Reply]:
    """Every reply echoes the key: as an HTTP error body, as a streamed error payload."""
    replies: list[Reply] = []
    for text in _echoes(key):
        replies.append(status(401, {"error": {"message": text}}))
        replies.append(status(503, {"error": {"message": text}}))
        replies.append(Reply(steps=(sse({"error": {"message": text}}), sse("[DONE]"))))
    return replies


async def _no_sleep(_seconds: float) -> None:
    return None


async def test_an_echoed_key_is_redacted_everywhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = _key()
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "trm_llm", "trm_store"):
        caplog.set_level(logging.DEBUG, logger=name)
    texts: list[str] = []
    replies = _hostile_server_replies(key)
    with open_store(f"sqlite:///{tmp_path / 'trm.db'}") as store:
        sink = StoreEventSink(store)
        cache = SqliteResponseCache(tmp_path / "cache.db", ttl_s=600, sink=sink)
        async with SimulatedServer() as server:
            server.script(*replies, normal())
            async with GovernedLLMClient(
                server.base_url,
                "sim",
                api_key=key,
                cache=cache,
                sink=sink,
                retry=RetryPolicy(max_attempts=1),
                sleep=_no_sleep,
            ) as client:
                texts.append(repr(client))
                for i in range(len(replies)):
                    with pytest.raises(LLMError) as info:
                        await client.chat(USER, temperature=i)
                    texts += chain_texts(info.value)
                answer = await client.chat(USER, seed=1)
                assert (await client.chat(USER, seed=1)).cached
        assert answer.content == "Hello, world"
        assert all(r.headers["authorization"] == f"Bearer {key}" for r in server.requests)
        events = list(store.read_all())
        texts += [json.dumps(e.data) + json.dumps(e.meta) + e.stream_id for e in events]
    import sqlite3

    with sqlite3.connect(tmp_path / "cache.db") as conn:
        rows = conn.execute("SELECT namespace, key, value FROM llm_response_cache").fetchall()
    texts += [" ".join(map(str, row)) for row in rows]
    formatter = logging.Formatter()
    for record in caplog.records:
        texts.append(formatter.format(record) + repr(record.args))
    failed = [e for e in events if e.type == "llm.call_failed"]
    assert len(failed) == len(replies) and len(rows) == 1
    assert sum("***" in e.data["detail"] for e in failed) >= len(_echoes(key))
    assert leaks(key, texts) == []


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=60),
    before=st.text(max_size=30),
    after=st.text(max_size=30),
    start=st.integers(0, 60),
    size=st.integers(PARTIAL, 60),
)
def test_redaction_removes_every_long_fragment(
    secret: str, before: str, after: str, start: int, size: int
) -> None:
    """Property: whatever surrounds it, no PARTIAL-long run of the key survives redaction."""
    fragment = secret[start : start + size] or secret
    redact = Redactor(secret)
    out = redact(before + fragment + after)
    grams = {secret[i : i + min(PARTIAL, len(secret))] for i in range(len(secret))}
    assert not any(g and len(g) == min(PARTIAL, len(secret)) and g in out for g in grams)


MARKED = st.text(st.sampled_from("*#~%ab"), max_size=12)


@settings(max_examples=300, deadline=None)
@given(secret=MARKED.filter(bool), text=st.lists(st.one_of(MARKED, st.just("KEY")), max_size=6))
def test_redaction_never_spells_the_key_again_with_its_own_marker(
    secret: str, text: list[str]
) -> None:
    """A key made of the marker's characters (`*`, a one-character key): the marker that
    replaces it, next to what surrounds it, must not spell a run of it again."""
    out = Redactor(secret)("".join(secret if part == "KEY" else part for part in text))
    size = min(PARTIAL, len(secret))
    assert not any(secret[i : i + size] in out for i in range(len(secret) - size + 1))
