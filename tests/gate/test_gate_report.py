"""`trm gate-report`: JSON and table output from a real gate's events, read-only, and --plot."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import pytest

from tests.gate.arms import OK, WRONG, table, units
from trm_gate import Arm, Gate, GateResult
from trm_store import open_store
from trm_store.cli.gate_report import add_parser, gate_report
from trm_store.domain.errors import UnknownGateError
from trm_store.domain.gate_report import read_gate_report


def run_gate(url: str, gate_id: str = "g-rep") -> GateResult:
    pool = units(60)
    # Candidate better on every second unit, equal elsewhere: a few blocks before accepting.
    base = table(pool, WRONG)
    cand = table(pool, WRONG, **{u: OK for u in pool[::2]})
    with open_store(url) as store:
        return asyncio.run(
            Gate(store, block_size=10).run(
                gate_id, pool, baseline=Arm("b@1", base), candidate=Arm("c@1", cand), seed=4
            )
        )


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="trm")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_json_report_matches_the_gate(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_gate(store_url)
    args = parse(["gate-report", "g-rep", "--db", store_url, "--json"])
    assert args.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "decided" and report["decision"]["verdict"] == result.verdict
    assert report["seed"] == 4 and report["config"]["block_size"] == 10
    assert len(report["blocks"]) == result.blocks
    assert report["blocks"][-1]["e_value"] == pytest.approx(result.e_value)
    assert report["blocks"][-1]["total_wins"] == result.wins
    assert [b["block"] for b in report["blocks"]] == list(range(1, result.blocks + 1))


def test_table_report_shows_blocks_path_and_verdict(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_gate(sqlite_url)
    with open_store(sqlite_url, read_only=True) as store:
        assert gate_report(store, "g-rep") == 0
    out = capsys.readouterr().out
    assert "gate g-rep" in out and "b@1" in out and "c@1" in out
    assert f"verdict {result.verdict}" in out
    assert "█" in out  # the e-value path
    assert out.count("continue") == result.blocks - 1


def test_unknown_gate_is_a_typed_error(sqlite_url: str) -> None:
    run_gate(sqlite_url)
    with open_store(sqlite_url, read_only=True) as store, pytest.raises(UnknownGateError):
        read_gate_report(store, "nope")


def test_plot_without_matplotlib_is_a_clear_error(
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_gate(sqlite_url)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    png = tmp_path / "path.png"
    with open_store(sqlite_url, read_only=True) as store:
        assert gate_report(store, "g-rep", plot=str(png)) == 2
    assert "needs matplotlib" in capsys.readouterr().err
    assert not png.exists()


def test_plot_writes_a_png(sqlite_url: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the optional `plot` extra
    run_gate(sqlite_url)
    png = tmp_path / "path.png"
    with open_store(sqlite_url, read_only=True) as store:
        assert gate_report(store, "g-rep", plot=str(png)) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_says_where_it_wrote_and_counts_blocks_in_integers(
    sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    from trm_store.cli.gate_report import figure

    run_gate(sqlite_url)
    png = tmp_path / "path.png"
    with open_store(sqlite_url, read_only=True) as store:
        assert gate_report(store, "g-rep", plot=str(png)) == 0
        report = read_gate_report(store, "g-rep")
    assert f"wrote {png.resolve()}" in capsys.readouterr().err
    fig = figure(report)
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


def test_plot_into_a_missing_folder_is_one_line_exit_2(
    sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    run_gate(sqlite_url)
    with open_store(sqlite_url, read_only=True) as store:
        assert gate_report(store, "g-rep", plot=str(tmp_path / "no" / "such.png")) == 2
    err = capsys.readouterr().err
    assert err.startswith("trm: cannot write") and "Traceback" not in err
