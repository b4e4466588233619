"""`trm diagnose` killed mid-run: a rerun diagnoses every item exactly once; `--retry-uncertain`
(and only it) asks the uncertain ones again, with a fresh sample rather than the cached answer."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.helpers import TierServer, child_env, trm, trm_command, write_items
from trm_store import open_store
from trm_store.domain.diagnosis import done_question_ids, read_diagnoses

ITEMS = 24
ANSWERS = ("correct", "Wrong.", "uncertain", "no idea")  # the last one names no tier
KILL_AT_REQUEST = 9
CONCURRENCY = 2


@pytest.fixture
def server() -> Iterator[TierServer]:
    srv = TierServer(delay_s=0.1)  # slow enough per item to kill the job mid-way
    stop = srv.run_in_thread()
    yield srv
    stop()


def _items(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    answers = {f"q{i:02}": ANSWERS[i % len(ANSWERS)] for i in range(ITEMS)}
    items = [
        {"question_id": qid, "question": f"({qid}) {i} + 1?", "hint": f"[[say:{answers[qid]}]]"}
        for i, qid in enumerate(answers)
    ]
    return write_items(tmp_path / "items.jsonl", items), answers


def _events_per_question(url: str) -> Counter[str]:
    with open_store(url) as store:
        return Counter(e.data["question_id"] for e in store.read_stream("diagnosis:r1"))


def test_kill_rerun_and_retry_uncertain(store_url: str, tmp_path: Path, server: TierServer) -> None:
    items, answers = _items(tmp_path)
    args = ["diagnose", "--run-id", "r1", "--items", str(items), "--db", store_url]
    args += ["--base-url", server.base_url, "--model", "sim", "--json"]
    child = subprocess.Popen(
        trm_command(*args, "--concurrency", str(CONCURRENCY)),
        cwd=tmp_path,
        env=child_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert server.wait_for_requests(KILL_AT_REQUEST, timeout_s=60)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL

    # Each worker records an answer before it sends its next request, so when request 9 arrived
    # at least 7 diagnoses were durable; the job was far from done.
    with open_store(store_url) as store:
        done_at_kill = done_question_ids(store, "r1")
    assert KILL_AT_REQUEST - CONCURRENCY <= len(done_at_kill) < ITEMS
    assert max(_events_per_question(store_url).values()) == 1

    resumed = trm(*args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["skipped_done"] == len(done_at_kill)
    assert summary["diagnosed"] == ITEMS - len(done_at_kill)
    assert _events_per_question(store_url) == Counter(dict.fromkeys(answers, 1))

    with open_store(store_url) as store:
        diagnoses = read_diagnoses(store, "r1")
    expected = {"correct": "correct", "Wrong.": "wrong", "uncertain": "uncertain"}
    assert {q: d["tier"] for q, d in diagnoses.items()} == {
        q: expected.get(a, "uncertain") for q, a in answers.items()
    }
    assert {q for q, d in diagnoses.items() if d["detail"]["parse"] == "unparseable"} == {
        q for q, a in answers.items() if a == "no idea"
    }
    uncertain = {q for q, d in diagnoses.items() if d["tier"] == "uncertain"}
    assert len(uncertain) == ITEMS // 2

    # Without the flag, uncertain items are done: nothing is asked, nothing recorded.
    requests = server.request_count
    again = trm(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["diagnosed"], server.request_count) == (0, requests)

    # With it, exactly the uncertain items are asked again, each by a real request (the cache
    # holds their first answers, but a retry is salted with the attempt number).
    retried = trm(*args, "--retry-uncertain", cwd=tmp_path)
    assert retried.returncode == 0, retried.stderr
    summary = json.loads(retried.stdout)
    assert (summary["skipped_done"], summary["diagnosed"]) == (
        ITEMS - len(uncertain),
        len(uncertain),
    )
    assert summary["llm"]["cache_hits"] == 0
    asked = [re.search(r"\((q\d+)\)", p) for p in server.prompts()[requests:]]
    assert sorted(m.group(1) for m in asked if m) == sorted(uncertain)
    assert _events_per_question(store_url) == Counter(
        {q: 2 if q in uncertain else 1 for q in answers}
    )
