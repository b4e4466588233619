"""Numbers and strings out of range are typed errors, the same on both backends (issue 14 point 6).

For any int, str or timedelta argument that reaches the database, SQLite and PostgreSQL agree:
both accept it (and read back the same), or both raise the same typed error class and write
nothing. Each property runs the same call on a SQLite store and on a PostgreSQL one side by side.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trm_store import NewEvent, Store, StoreError, open_store
from trm_store.cli.staleness import age_text, seconds_arg
from trm_store.domain.diagnosis import read_diagnoses, record_diagnosis
from trm_store.domain.gate_leases import mark_stale_gates
from trm_store.domain.llm_calls import llm_calls
from trm_store.domain.metrics import read_dual_metric, write_dual_metric
from trm_store.domain.run_leases import fail_run, mark_stale_runs
from trm_store.domain.run_log import RunLog
from trm_store.domain.runs import run_info

SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
EDGE_INTS = [2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, -1, 0]
ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-(2**70), 2**70))
texts = st.one_of(
    st.sampled_from(["a\udcff", "a\x00b", "\ud800", "\ud83d\ude00", "ok", "é\u2028", "\U0001f600"]),
    st.text(st.characters(codec=None, exclude_categories=()), min_size=1, max_size=6),
)
"""Text with surrogates (alone, and two making a pair) and NUL among the rest (hypothesis' default
leaves them out)."""


@pytest.fixture
def stores(sqlite_url: str, pg_url: str) -> Iterator[tuple[Store, Store]]:
    with open_store(sqlite_url) as lite, open_store(pg_url) as pg:
        yield lite, pg


Outcome = tuple[str, Any]


def attempt(store: Store, call: Callable[[Store], Any]) -> Outcome:
    """("ok", what `call` returned) or ("error", the typed error's class); anything that is not
    a StoreError fails the test (a raw OverflowError, UnicodeEncodeError, driver error)."""
    before = sum(1 for _ in store.read_all())
    try:
        return ("ok", call(store))
    except StoreError as e:
        assert sum(1 for _ in store.read_all()) == before, "an error wrote something"
        return ("error", type(e))


def agree(stores: tuple[Store, Store], call: Callable[[Store], Any]) -> Outcome:
    lite, pg = (attempt(s, call) for s in stores)
    assert lite == pg, f"SQLite {lite} but PostgreSQL {pg}"
    return lite


@SETTINGS
@given(stream_id=texts, expected=st.none() | ints, detail=texts)
@example(stream_id="a\udcff", expected=None, detail="x")
@example(stream_id="s", expected=2**63, detail="x")
@example(stream_id="s", expected=2**64, detail="x")
@example(stream_id="s", expected=0, detail="a\x00")
@example(stream_id="s", expected=None, detail="\ud83d\ude00")
def test_append_arguments_agree(
    stores: tuple[Store, Store], stream_id: str, expected: int | None, detail: str
) -> None:
    event = {"question_id": "q", "tier": "t", "detail": detail}

    def append(store: Store) -> list[Any]:
        (recorded,) = store.append(
            stream_id,
            [NewEvent("diagnosis.question_diagnosed", event, meta={"note": detail})],
            expected_version=expected,
        )
        # From its own version on: the stores serve every example, and an earlier one may have
        # appended to the same stream id (hypothesis tries "0" more than once).
        read = store.read_stream(stream_id, recorded.version)
        return [(e.stream_id, e.data, e.meta["note"]) for e in read]

    outcome, read = agree(stores, append)
    if outcome == "ok":  # and what was written reads back as it was given
        assert [(data["detail"], note) for _, data, note in read] == [(detail, detail)]


@SETTINGS
@given(epoch=ints)
@example(epoch=2**31)
@example(epoch=2**63)
def test_dual_metric_epochs_agree(stores: tuple[Store, Store], epoch: int) -> None:
    run_id = f"r{abs(epoch) % 10**6}"
    for store in stores:
        if not store.read_stream(f"run:{run_id}"):
            with RunLog(store, run_id):
                pass

    def write(store: Store) -> list[Any]:
        write_dual_metric(
            store,
            run_id=run_id,
            epoch=epoch,
            version_kind="slow_candidate",
            skills_version="s",
            prompts_version="p",
            pool="val",
            hard_acc=0.5,
        )
        return [r["epoch"] for r in read_dual_metric(store, run_id=run_id, epoch=epoch)]

    agree(stores, write)
    agree(stores, lambda s: len(read_dual_metric(s, run_id=run_id, epoch=epoch)))


@SETTINGS
@given(after=ints, batch_size=ints)
@example(after=2**63, batch_size=2**63)
def test_read_counts_agree(stores: tuple[Store, Store], after: int, batch_size: int) -> None:
    agree(stores, lambda s: llm_calls(s, after=after))
    agree(stores, lambda s: RunLog(s, "never", batch_size=batch_size) and None)


@SETTINGS
@given(text=texts)
@example(text="a\udcff")
@example(text="a\x00")
def test_domain_text_agrees(stores: tuple[Store, Store], text: str) -> None:
    def diagnose(store: Store) -> Any:
        record_diagnosis(store, run_id="r", question_id="q", tier="t", detail={text: text})
        return read_diagnoses(store, "r")["q"]["detail"]

    agree(stores, diagnose)
    agree(stores, lambda s: run_info(s, text))
    agree(stores, lambda s: llm_calls(s, source=text))
    run_id = f"f{uuid.uuid4().hex}"
    for store in stores:
        RunLog(store, run_id).__enter__()  # left running, for fail_run
    agree(stores, lambda s: fail_run(s, run_id, reason=text))


@SETTINGS
@given(days=st.integers(1, timedelta.max.days), year=st.integers(1, 9999))
@example(days=10**8, year=2026)
@example(days=timedelta.max.days, year=9999)
def test_stale_windows_agree(stores: tuple[Store, Store], days: int, year: int) -> None:
    for store in stores:
        if not store.read_stream("run:old"):
            RunLog(store, "old").__enter__()  # left running: a stale candidate
    now = datetime(year, 1, 1, tzinfo=UTC)
    agree(stores, lambda s: mark_stale_runs(s, timedelta(days=days), now=now))
    agree(stores, lambda s: mark_stale_gates(s, timedelta(days=days), now=now))


def trm(*argv: str) -> list[str]:
    """Run `trm` in a subprocess; its stderr lines, after checking it exited 2 without a
    traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "trm_store.cli", *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    return [line for line in done.stderr.splitlines() if not line.startswith(("usage", " "))]


@pytest.mark.parametrize("command", ["runs", "gates"])
@pytest.mark.parametrize("seconds", ["1e12", "1e20", "8.64e13"])
def test_cli_stale_after_out_of_range_is_one_line(
    command: str, seconds: str, sqlite_url: str
) -> None:
    with open_store(sqlite_url):
        pass
    (message,) = trm(command, "--db", sqlite_url, "--stale-after", seconds, "--mark-stale")
    assert "stale-after" in message or "older_than" in message


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "--fail", "\udcff"],
        ["runs", "--fail", "r", "--reason", "bad\udcff"],
        ["llm-stats", "--source", "\udcff"],
        ["gate-report", "\udcff"],
    ],
)
def test_cli_text_no_backend_keeps_is_one_line(argv: list[str], sqlite_url: str) -> None:
    """A byte that is not UTF-8 in argv arrives as a lone surrogate."""
    with open_store(sqlite_url) as store:
        RunLog(store, "r").__enter__()  # left running, for --fail
    (message,) = trm(*argv, "--db", sqlite_url)
    assert message.startswith("trm: DomainInputError: "), message


def test_the_stale_after_limit_is_the_one_the_message_names() -> None:
    """The bound printed is exact: the number it names is accepted, the next one up refused."""
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        seconds_arg("1e14")
    limit = str(refused.value).split("<= ")[1].split(",")[0]
    assert seconds_arg(limit) == float(limit)
    with pytest.raises(argparse.ArgumentTypeError):
        seconds_arg(str(float(limit) + 1))


def test_an_age_a_little_in_the_future_reads_zero() -> None:
    """A recorder's clock a little ahead of the reader's gives no "-0s"."""
    assert age_text(-0.4) == "0s"
    assert age_text(59.6) == "60s"
