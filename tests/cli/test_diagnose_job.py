"""The diagnosis job: reading tiers from answers, prompts, cache salts, and what a failed call
leaves behind (nothing: an infrastructure failure is never a label)."""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.cli.helpers import TierServer, use_child_env, write_items
from trm_llm.simulated_server import Reply, SimulatedServer, status
from trm_store import cli as launch
from trm_store import open_store
from trm_store.cli.diagnose.inputs import Item, load_items
from trm_store.cli.diagnose.template import PromptTemplate
from trm_store.cli.diagnose.tiers import DEFAULT_TIERS, parse_tier
from trm_store.domain.diagnosis import done_question_ids, read_diagnoses
from trm_store.domain.llm_calls import CALL_FAILED

TIERS = DEFAULT_TIERS


@pytest.mark.parametrize(
    ("answer", "tier", "how"),
    [
        ("correct", "correct", "first_word"),
        ("  Wrong.", "wrong", "first_word"),
        ("UNCERTAIN - the item lacks a reference", "uncertain", "first_word"),
        ("The answer is wrong: 3 is not 4.", "wrong", "only_tier"),
        ("<think>correct? or wrong?</think> wrong", "wrong", "first_word"),
        ("incorrect", "uncertain", "unparseable"),
        ("It is either correct or wrong.", "uncertain", "ambiguous"),
        ("", "uncertain", "unparseable"),
    ],
)
def test_parse_tier(answer: str, tier: str, how: str) -> None:
    parsed = parse_tier(answer, TIERS)
    assert (parsed.tier, parsed.how) == (tier, how)


@given(st.text())
def test_any_answer_gives_one_of_the_tiers(answer: str) -> None:
    assert parse_tier(answer, TIERS).tier in TIERS


@given(
    st.sampled_from(TIERS),
    st.text(alphabet=string.whitespace + "*_\"'`", max_size=4),
    st.text(alphabet=string.whitespace + ".!*\"'`", max_size=4),
    st.booleans(),
)
def test_a_tier_in_any_case_and_wrapping_is_read(
    tier: str, before: str, after: str, upper: bool
) -> None:
    parsed = parse_tier(before + (tier.upper() if upper else tier.title()) + after, TIERS)
    assert parsed.tier == tier


def test_items_keep_their_fields_and_order(tmp_path: Path) -> None:
    path = tmp_path / "i.jsonl"
    path.write_text('{"question_id": "b", "x": [1, 2]}\n\n{"question_id": "a", "y": "é"}\n')
    assert load_items(path) == [Item("b", {"x": [1, 2]}), Item("a", {"y": "é"})]


def test_prompts() -> None:
    item = Item("q1", {"question": "1 + 1?", "prediction": 2, "cost": "$5"})
    default = PromptTemplate.load(None, TIERS).render(item)
    assert "question: 1 + 1?\nprediction: 2\ncost: $5\n" in default
    assert "one of: correct, wrong, uncertain." in default
    custom = PromptTemplate("[$question_id] $question -> ${prediction}$$? ($tiers)", TIERS)
    assert custom.render(item) == "[q1] 1 + 1? -> 2$? (correct, wrong, uncertain)"


# -- end to end through the entry point, in-process -------------------------------------------


@pytest.fixture
def serve() -> Iterator[Callable[[SimulatedServer], str]]:
    """Start servers in threads; returns their base URL; stops them all afterwards."""
    stops = []

    def start(server: SimulatedServer) -> str:
        stops.append(server.run_in_thread())
        return server.base_url

    yield start
    for stop in stops:
        stop()


def _diagnose(
    capsys: pytest.CaptureFixture[str], url: str, items: Path, base_url: str, *args: str
) -> tuple[int, dict[str, Any], str]:
    argv = ["diagnose", "--items", str(items), "--db", url, "--base-url", base_url]
    code = launch.main([*argv, "--model", "sim", "--json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def _items(tmp_path: Path, count: int) -> Path:
    # Each prompt its own (the default template shows every field but the id): with identical
    # prompts a later item could hit the cache entry an earlier one of the same run wrote,
    # whenever the calls happened not to overlap.
    items = [
        {"question_id": f"q{i}", "question": f"item {i}", "hint": "[[say:correct]]"}
        for i in range(count)
    ]
    return write_items(tmp_path / "items.jsonl", items)


def test_failed_calls_record_nothing_and_a_rerun_picks_them_up(
    sqlite_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[SimulatedServer], str],
) -> None:
    use_child_env(monkeypatch, tmp_path, LLM_MAX_ATTEMPTS="2", LLM_BREAKER_FAIL_THRESHOLD="100")
    items = _items(tmp_path, 3)
    down = serve(SimulatedServer(default=status(500)))

    code, summary, _ = _diagnose(capsys, sqlite_url, items, down, "--run-id", "r1")
    assert code == 1
    assert (summary["diagnosed"], summary["failed"]) == (0, {"RetriesExhausted": 3})
    assert summary["llm"] == {
        "calls": 3,
        "cache_hits": 0,
        "retries": 3,
        "failed_attempts_by_reason": {"http_500": 6},
    }
    with open_store(sqlite_url) as store:
        assert done_question_ids(store, "r1") == set()
        failed = [e for e in store.read_stream("llm:sim") if e.type == CALL_FAILED]
        assert len(failed) == 3

    up = serve(TierServer())
    code, summary, _ = _diagnose(capsys, sqlite_url, items, up, "--run-id", "r1")
    assert (code, summary["diagnosed"], summary["tiers"]) == (0, 3, {"correct": 3})


@pytest.mark.parametrize(
    ("reply", "env", "code", "stopped", "failed"),
    [
        (status(401), {}, 2, "FatalLLMError", {"FatalLLMError": 1}),
        (
            status(500),
            {"LLM_MAX_ATTEMPTS": "1", "LLM_BREAKER_FAIL_THRESHOLD": "1"},
            1,
            "CircuitOpenError",
            {"RetriesExhausted": 1, "CircuitOpenError": 1},
        ),
        (status(400), {}, 1, None, {"FatalLLMError http_400": 5}),  # maybe one prompt: go on
    ],
)
def test_what_a_failed_call_stops(
    reply: Reply,
    env: dict[str, str],
    code: int,
    stopped: str | None,
    failed: dict[str, int],
    sqlite_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[SimulatedServer], str],
) -> None:
    """An endpoint-wide failure (401, an open breaker) stops the job: the items left are not
    started. A 400 fails its item only. Nothing is recorded for a failed call either way."""
    use_child_env(monkeypatch, tmp_path, LLM_BREAKER_COOLDOWN_S="3600", **env)
    base_url = serve(SimulatedServer(default=reply))
    args = ("--run-id", "r1", "--concurrency", "1")
    result, summary, err = _diagnose(capsys, sqlite_url, _items(tmp_path, 5), base_url, *args)
    assert (result, summary["failed"], summary["diagnosed"]) == (code, failed, 0)
    assert summary["not_started"] == 5 - sum(failed.values())
    if stopped is None:
        assert summary["stopped"] is None and "stopped early" not in err
    else:
        assert summary["stopped"].startswith(stopped)
        assert err.strip().startswith("trm: stopped early: " + stopped)
    with open_store(sqlite_url) as store:
        assert done_question_ids(store, "r1") == set()


def test_cache_salt_reuses_answers_within_an_attempt_only(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[SimulatedServer], str],
) -> None:
    """Same run and attempt (a rerun after a crash lost the records): cache hits. Another run
    id: fresh samples. The cache file is shared; the stores are not."""
    use_child_env(monkeypatch, tmp_path)
    server = TierServer()
    base_url = serve(server)
    items = _items(tmp_path, 4)
    first, lost, other = (f"sqlite:///{tmp_path / name}" for name in ("a.db", "b.db", "c.db"))

    _, summary, _ = _diagnose(capsys, first, items, base_url, "--run-id", "r1")
    assert summary["llm"]["cache_hits"] == 0
    _, summary, _ = _diagnose(capsys, lost, items, base_url, "--run-id", "r1")
    assert (summary["diagnosed"], summary["llm"]["cache_hits"]) == (4, 4)
    _, summary, _ = _diagnose(capsys, other, items, base_url, "--run-id", "r2")
    assert (summary["diagnosed"], summary["llm"]["cache_hits"]) == (4, 0)
    assert server.request_count == 8
    with open_store(lost) as store:
        assert all(d["detail"]["cached"] for d in read_diagnoses(store, "r1").values())


def test_text_summary(
    sqlite_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[SimulatedServer], str],
) -> None:
    use_child_env(monkeypatch, tmp_path)
    items = [
        {"question_id": "q1", "hint": "[[say:correct]]"},
        {"question_id": "q2", "hint": "[[say:hmm]]"},
    ]
    path = write_items(tmp_path / "items.jsonl", items)
    argv = ["diagnose", "--run-id", "r1", "--items", str(path), "--db", sqlite_url]
    assert launch.main([*argv, "--base-url", serve(TierServer()), "--model", "sim"]) == 0
    out = capsys.readouterr().out
    assert "run r1: 2 items, 0 skipped as done, 2 diagnosed now" in out
    assert "recorded as uncertain, the answer naming no single tier: unparseable 1" in out
    assert "LLM: 2 calls, 0 cache hits, 0 retries" in out


def test_a_server_with_one_slot_gets_every_item_at_the_default_concurrency(
    sqlite_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[SimulatedServer], str],
) -> None:
    """Issue 17: at its default concurrency (4) against a server that cuts the streams in
    flight when a second request arrives, `trm diagnose` stopped after a few items (the breaker
    opened on the cut streams). The limiter learns the one slot: every item is diagnosed."""
    use_child_env(monkeypatch, tmp_path)
    server = TierServer(delay_s=0.01)
    server.max_in_flight = 1
    base_url = serve(server)
    items = [{"question_id": f"q{i}", "hint": f"[[say:correct]] #{i}"} for i in range(30)]
    path = write_items(tmp_path / "items.jsonl", items)  # 30 prompts: no cache hit among them
    code, summary, _ = _diagnose(capsys, sqlite_url, path, base_url, "--run-id", "r1")
    assert (code, summary["diagnosed"], summary["failed"], summary["stopped"]) == (0, 30, {}, None)
    assert summary["llm"]["cache_hits"] == 0
    assert server.overloaded > 0  # it was overloaded, and the client learnt
    with open_store(sqlite_url) as store:
        assert len(done_question_ids(store, "r1")) == 30
