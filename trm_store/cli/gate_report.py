"""`trm gate-report GATE_ID`: a gate's blocks and e-value path, from `read_gate_report`.

The report is a derived view of the gate's events alone, and the store is opened read-only, so a
report never writes and works on a store whose projections are stale. `--json` prints the same
content as JSON, with each block's e-values beside the stored log e-values (null where one
overflows a float: JSON has no infinity); `--plot FILE.png` draws the log e-value path with
matplotlib (the optional `plot` extra, imported only when asked for).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trm_gate import to_e_value
from trm_store.bootstrap import open_store
from trm_store.cli.common import json_e_value, report_console
from trm_store.domain.gate_report import GateReport, GateReportBlock, read_gate_report
from trm_store.store import Store

__all__ = ["add_parser", "figure", "gate_report", "run"]

_BAR = 24  # characters of the e-value path bars


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "gate-report",
        help="show a gate's blocks, W/L, INFRA, cache hits and e-value path",
        description="Show one gate (from its gate:{id} events): parameters, one row per block "
        "(units, W/L/ties, INFRA units per arm, baseline cache hits, E+ and E-, decision), the "
        "e-value path against the 1/alpha and 1/beta thresholds, and the verdict.",
    )
    parser.add_argument("gate_id", metavar="GATE_ID")
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--plot", metavar="FILE.png", help="also draw the e-value path to a PNG")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with open_store(args.db, read_only=True) as store:
        return gate_report(store, args.gate_id, as_json=args.json, plot=args.plot)


def gate_report(
    store: Store, gate_id: str, *, as_json: bool = False, plot: str | None = None
) -> int:
    """Print the report for `gate_id` (and draw it to `plot`); the exit code (0, or 2 if the
    plot was asked for and matplotlib is missing)."""
    report = read_gate_report(store, gate_id)
    if as_json:
        print(json.dumps(_as_json(report), indent=2, allow_nan=False))
    else:
        # Piped output gets a fixed width wide enough for the block table, not rich's 80.
        _print(report_console(), report)
    if plot is not None:
        try:
            _plot(report, Path(plot))
        except ImportError:
            print(
                "trm: --plot needs matplotlib: pip install 'trm[plot]' (or matplotlib)",
                file=sys.stderr,
            )
            return 2
        except OSError as exc:
            print(f"trm: cannot write {plot}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"trm: wrote {Path(plot).resolve()}", file=sys.stderr)
    return 0


def _as_json(report: GateReport) -> dict[str, Any]:
    """The report as `--json` prints it: times as ISO 8601, e-values beside the logs."""
    return {
        **report,
        "started_at": report["started_at"].isoformat(),
        "blocks": [_json_block(b) for b in report["blocks"]],
    }


def _json_block(block: GateReportBlock) -> dict[str, Any]:
    return {
        **block,
        "e_value": json_e_value(to_e_value(block["log_e_value"])),
        "futility_e_value": json_e_value(to_e_value(block["log_futility_e_value"])),
    }


def _bar(log_value: float, log_threshold: float) -> str:
    filled = round(_BAR * min(1.0, max(0.0, log_value / log_threshold)))
    return "█" * filled + "·" * (_BAR - filled)


def _fmt(log_e_value: float) -> str:
    return f"{to_e_value(log_e_value):.3g}"  # +inf shows as `inf`


def _print(console: Console, report: GateReport) -> None:
    config = report["config"]
    log_a, log_b = -math.log(config["alpha"]), -math.log(config["beta"])
    console.print(
        f"[bold]gate {escape(report['gate_id'])}[/]  "
        f"baseline [cyan]{escape(report['baseline_snapshot'])}[/] vs "
        f"candidate [cyan]{escape(report['candidate_snapshot'])}[/]  "
        f"pool {report['pool_size']} units, seed {report['seed']}"
    )
    console.print(
        "alpha {alpha}  beta {beta}  p1 {p1}  block {block_size}  max_pairs {max_pairs}  "
        "infra_max_rate {infra_max_rate}  infra_min_units {infra_min_units}".format(**config)
    )
    table = Table(title="blocks")
    for name in ("block", "units", "W", "L", "ties", "INFRA b", "INFRA c", "cache", "ΣW-ΣL"):
        table.add_column(name, justify="right")
    for name in ("E+", "E-", "decision"):
        table.add_column(name)
    for b in report["blocks"]:
        table.add_row(
            *(str(b[k]) for k in ("block", "units", "wins", "losses", "ties")),
            *(str(b[k]) for k in ("infra_baseline", "infra_candidate", "baseline_cache_hits")),
            f"{b['total_wins']}-{b['total_losses']}",
            _fmt(b["log_e_value"]),
            _fmt(b["log_futility_e_value"]),
            escape(b["decision"]),
        )
    console.print(table)
    path = Table(title="e-value path: share of the log-distance to each threshold", box=None)
    path.add_column("block", justify="right")
    path.add_column(f"E+ -> 1/alpha = {1 / config['alpha']:g}")
    path.add_column(f"E- -> 1/beta = {1 / config['beta']:g}")
    for b in report["blocks"]:
        path.add_row(
            str(b["block"]),
            _bar(b["log_e_value"], log_a),
            _bar(b["log_futility_e_value"], log_b),
        )
    console.print(path)
    decision = report["decision"]
    if decision is None:
        console.print("[yellow]running[/]: no decision recorded (yet)")
        return
    colour = {"accept": "green", "reject": "red"}.get(decision["verdict"], "yellow")
    console.print(
        f"verdict [bold {colour}]{escape(decision['verdict'])}[/]: {escape(decision['reason'])}  "
        f"W {decision['wins']} / L {decision['losses']} / ties {decision['ties']}, "
        f"INFRA units baseline {decision['infra_units_baseline']} / candidate "
        f"{decision['infra_units_candidate']}, {decision['units_evaluated']} units evaluated, "
        f"{decision['baseline_cache_hits']} baseline cache hits"
    )


def _plot(report: GateReport, path: Path) -> None:
    fig = figure(report)
    try:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    finally:
        importlib.import_module("matplotlib.pyplot").close(fig)


def figure(report: GateReport) -> Any:
    """The e-value path as a matplotlib figure: log E+ and log E- per block (integer ticks)
    against log(1/alpha) and log(1/beta)."""
    # The optional `plot` extra: imported here only, so the report works without it.
    importlib.import_module("matplotlib").use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")

    blocks = [b["block"] for b in report["blocks"]]
    config = report["config"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(blocks, [b["log_e_value"] for b in report["blocks"]], marker="o", label="log E+")
    ax.plot(
        blocks, [b["log_futility_e_value"] for b in report["blocks"]], marker="s", label="log E-"
    )
    ax.axhline(-math.log(config["alpha"]), linestyle="--", color="green", label="log(1/alpha)")
    ax.axhline(-math.log(config["beta"]), linestyle=":", color="red", label="log(1/beta)")
    ticker = importlib.import_module("matplotlib.ticker")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # blocks are counted
    ax.set_xlabel("block")
    ax.set_ylabel("log e-value")
    ax.set_title(f"gate {report['gate_id']}")
    ax.legend()
    return fig
