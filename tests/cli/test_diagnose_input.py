"""`trm diagnose` given bad input: exit 2, one clear line on stderr, nothing sent or written."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from tests.cli.helpers import TierServer, child_env, trm, use_child_env, write_items
from trm_store import cli as launch
from trm_store import open_store
from trm_store.domain.diagnosis import record_diagnosis

GOOD = [{"question_id": "q1", "question": "1 + 1?"}, {"question_id": "q2", "question": "2 + 2?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[TierServer]:
    srv = TierServer()
    stop = srv.run_in_thread()
    yield srv
    stop()


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


CASES: dict[str, tuple[Callable[[Path], Path], list[str], str]] = {
    "missing file": (lambda d: d / "nope.jsonl", [], "does not exist"),
    "bad JSON line": (
        lambda d: _write(d / "i.jsonl", json.dumps(GOOD[0]) + '\n{"question_id": "q2",\n'),
        [],
        "i.jsonl:2: not valid JSON",
    ),
    "NaN value": (
        lambda d: _write(d / "i.jsonl", '{"question_id": "q1", "score": NaN}\n'),
        [],
        "i.jsonl:1: not valid JSON",
    ),
    "duplicate ids": (
        lambda d: write_items(d / "i.jsonl", [*GOOD, {"question_id": "q1", "question": "?"}]),
        [],
        "i.jsonl:3: duplicate question_id 'q1' (first on line 1)",
    ),
    "no question_id": (
        lambda d: write_items(d / "i.jsonl", [{"question": "?"}]),
        [],
        "i.jsonl:1: an item must be a JSON object with a question_id",
    ),
    "blank question_id": (
        lambda d: write_items(d / "i.jsonl", [{"question_id": " "}]),
        [],
        "i.jsonl:1: question_id must be a non-blank string",
    ),
    "empty file": (lambda d: _write(d / "i.jsonl", "\n"), [], "holds no items"),
    "empty run id": (
        lambda d: write_items(d / "i.jsonl", GOOD),
        ["--run-id", ""],
        "run_id must be a non-blank string",
    ),
    "template field missing": (
        lambda d: write_items(d / "i.jsonl", GOOD),
        ["--template", "TEMPLATE"],
        "item 'q1' lacks field(s) ['reference'] used by the template",
    ),
    "tiers without uncertain": (
        lambda d: write_items(d / "i.jsonl", GOOD),
        ["--tiers", "correct,wrong"],
        "including 'uncertain'",
    ),
}


SUBPROCESS = {"missing file", "bad JSON line", "duplicate ids", "empty run id"}
"""Run as a real child process; the others call the same entry point in-process (faster)."""


def _in_process(args: list[str], capsys: pytest.CaptureFixture[str]) -> CompletedProcess[str]:
    code = launch.main(args)
    out, err = capsys.readouterr()
    return CompletedProcess(args, code, out, err)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_before_anything_is_written(
    case: str,
    sqlite_url: str,
    tmp_path: Path,
    server: TierServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_items, extra, message = CASES[case]
    with open_store(sqlite_url) as store:
        record_diagnosis(store, run_id="r0", question_id="q0", tier="correct")
        head = store.head_position()
    template = _write(tmp_path / "t.txt", "Is $question right, given $reference? $tiers")
    extra = [str(template) if a == "TEMPLATE" else a for a in extra]
    if "--run-id" not in extra:
        extra += ["--run-id", "r1"]
    requests = server.request_count

    args = ["diagnose", "--items", str(make_items(tmp_path)), "--db", sqlite_url]
    args += ["--base-url", server.base_url, "--model", "sim", *extra]
    if case in SUBPROCESS:
        result = trm(*args, cwd=tmp_path)
    else:
        use_child_env(monkeypatch, tmp_path)
        result = _in_process(args, capsys)

    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("trm: ") and result.stderr.count("\n") == 1
    assert message in result.stderr
    with open_store(sqlite_url) as store:
        assert store.head_position() == head
    assert server.request_count == requests
    assert not (tmp_path / "llm_cache.db").exists()


def test_missing_llm_endpoint_is_a_one_line_error(sqlite_url: str, tmp_path: Path) -> None:
    items = write_items(tmp_path / "i.jsonl", GOOD)
    args = ("diagnose", "--run-id", "r1", "--items", str(items), "--db", sqlite_url)
    result = trm(*args, cwd=tmp_path, env=child_env(tmp_path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "LLMSettingsError" in result.stderr and "LLM_BASE_URL" in result.stderr
    assert "--base-url" in result.stderr
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()
