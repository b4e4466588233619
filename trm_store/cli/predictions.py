"""`trm predictions RUN`: one run's predictions (latest per question) and their totals, read-only.

What `read_predictions` returns, as a table with accuracy and INFRA counts under it, or
(--json) as one JSON document. Recorded strings are shown as text, never as rich markup.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from rich.table import Table
from rich.text import Text

from trm_store.bootstrap import open_store
from trm_store.cli.common import counts_text, report_console
from trm_store.domain._common import json_default
from trm_store.domain.runs import read_predictions, run_info
from trm_store.vocabulary import INFRA_STOP_REASONS

__all__ = ["add_parser", "run"]

_SHOWN = ("question_id", "unit_id", "prediction", "correct", "stop_reason")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "predictions",
        help="show one run's predictions and its accuracy",
        description="Show one run's predictions (the latest per question, in the order the "
        "questions were first seen), then its accuracy over judged questions and its INFRA "
        "count. Read-only.",
    )
    parser.add_argument("run_id", metavar="RUN")
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with open_store(args.db, read_only=True) as store:
        info = run_info(store, args.run_id)  # UnknownRunError for a run never registered
        predictions = read_predictions(store, args.run_id)
    judged = [p["correct"] for p in predictions if p["correct"] is not None]
    totals = {
        "predictions": len(predictions),
        "correct": sum(judged),
        "judged": len(judged),
        "accuracy": round(sum(judged) / len(judged), 6) if judged else None,
        "infra": sum(p["stop_reason"] in INFRA_STOP_REASONS for p in predictions),
        "stop_reasons": dict(Counter(p["stop_reason"] for p in predictions)),
    }
    if args.json:
        document = {"run_id": args.run_id, "status": info["status"], **totals, "rows": predictions}
        print(json.dumps(document, default=json_default, allow_nan=False))
        return 0
    console = report_console()
    table = Table(title=Text(f"predictions of run {args.run_id} ({info['status']})"))
    for name in _SHOWN:
        table.add_column(name)
    for p in predictions:
        table.add_row(*(Text(_cell(p[name])) for name in _SHOWN))
    console.print(table if predictions else Text(f"run {args.run_id} has no predictions"))
    accuracy = "-" if totals["accuracy"] is None else f"{totals['accuracy']:.3f}"
    console.print(
        Text(
            f"{totals['predictions']} predictions, accuracy {accuracy} "
            f"({totals['correct']}/{totals['judged']} judged), {totals['infra']} INFRA; "
            f"stop reasons: {counts_text(totals['stop_reasons'])}"
        )
    )
    return 0


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else json.dumps(value, default=json_default)
