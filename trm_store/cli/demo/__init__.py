"""`trm demo`: one gated epoch end to end, against a real endpoint or a simulated one.

This module is the command (arguments, the progress bar: units gated of the pool, with an ETA,
and questions answered; the output); its parts are the
package's modules, imported only when the command runs, so the other subcommands never load the
client, httpx or the simulated server:

- `epoch`: `run_demo`, the epoch end to end; `wiring`: its client, arms, gate and record;
- `arms`: one arm (`trm_gate.QuestionAsker` through the governed client), waiting out an
  open breaker;
- `pool`, `prompts`, `model`, `faults`, `server`: the bundled pool, the two prompts and the
  grader, the simulated model, its injected faults, and the loopback server that serves it;
- `outcome`: what was asked and what happened, as plain values;
- `report` (for people) and `summary` (`--json`): the output, read back from the events.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any
from urllib.parse import urlsplit

from trm_store.cli.common import int_in_range, report_console

__all__ = ["DEFAULT_SEED", "add_parser", "run"]

DEFAULT_SEED = 3  # shows every mechanism: INFRA in both arms, then their re-evaluation
_SEED_LIMIT = 2**63


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "demo",
        help="run one gated epoch end to end (simulated model with faults, or --base-url)",
        description="Gate a candidate prompt against a baseline prompt on a bundled pool of 288 "
        "questions in 72 units, through the governed client (response cache, retries, circuit "
        "breaker), recording everything as events. Without --base-url the answers come from a "
        "SIMULATED model on loopback that injects faults (truncated streams, resets, 429s, "
        "stalls, an outage). Exit 0 when the gate decided (accept, reject, inconclusive), 1 on "
        "infra_abort, 2 on bad arguments or a store error.",
    )
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument(
        "--base-url",
        metavar="URL",
        help="an OpenAI-compatible endpoint (vLLM, Ollama, llama.cpp: e.g. "
        "http://127.0.0.1:11434/v1); needs --model; API key from $LLM_API_KEY if set",
    )
    parser.add_argument("--model", metavar="M", help="the model to ask at --base-url")
    parser.add_argument(
        "--seed",
        type=int_in_range(0, _SEED_LIMIT - 1),
        default=DEFAULT_SEED,
        help=f"picks the candidate prompt, the simulated model and its faults, the unit order "
        f"(default {DEFAULT_SEED})",
    )
    parser.add_argument(
        "--concurrency",
        type=int_in_range(1, 256),
        default=8,
        help="most calls in flight (default 8); the client starts at up to 4 and learns how many "
        "the endpoint sustains",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the last gate of the workspace after a crash or Ctrl-C (its recorded "
        "blocks are kept, the rest run; same seed and unit order)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary instead")
    parser.set_defaults(run=run)


def _problem(args: argparse.Namespace) -> str | None:
    """Why the arguments cannot work together, or None."""
    if (args.base_url is None) != (args.model is None):
        return "--base-url and --model go together (neither: the simulated model)"
    if args.base_url is not None:
        try:
            parts = urlsplit(args.base_url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
        except ValueError:  # a bad port or IPv6 literal
            ok = False
        if not ok:
            return f"--base-url must be an http(s) URL with a host, got {args.base_url!r}"
    if args.model is not None and not args.model.strip():
        return "--model must not be blank"
    return None


def run(args: argparse.Namespace) -> int:
    problem = _problem(args)
    if problem is not None:
        print(f"trm demo: error: {problem}", file=sys.stderr)
        return 2
    import asyncio

    from rich.console import Console

    from trm_gate import GateInputError, GateProgress, GateStateError
    from trm_store.cli.common import progress_bar
    from trm_store.cli.demo.epoch import run_demo
    from trm_store.cli.demo.outcome import DemoOptions
    from trm_store.cli.demo.report import print_report
    from trm_store.cli.demo.summary import summary
    from trm_store.cli.demo.wiring import gate_settings

    try:
        gate_settings()  # checked before anything is written
    except GateInputError as e:  # GateSettingsError
        print(f"trm demo: error: {e}", file=sys.stderr)
        return 2
    options = DemoOptions(
        db=args.db,
        base_url=args.base_url,
        model=args.model,
        api_key=os.environ.get("LLM_API_KEY") or None,
        seed=args.seed,
        concurrency=args.concurrency,
    )
    answered = 0
    with progress_bar(Console(stderr=True), transient=True) as progress:
        task = progress.add_task("trm demo: starting", total=None)

        def tick() -> None:
            nonlocal answered
            answered += 1
            progress.update(task, description=f"trm demo: {answered} questions answered")

        def block(p: GateProgress) -> None:
            text = f"trm demo: block {p.block}/{p.blocks}, E+ {p.e_value:.3g}, {answered} answered"
            progress.update(task, total=p.units_total, completed=p.units_done, description=text)

        try:
            demo = run_demo(options, on_answer=tick, on_block=block, resume=args.resume)
            outcome = asyncio.run(demo)
        except (GateStateError, GateInputError) as e:  # e.g. --resume of a gate that decided
            print(f"trm demo: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(
                "trm demo: interrupted (the runs are marked failed; `trm demo --resume` "
                "continues the gate)",
                file=sys.stderr,
            )
            return 130
    if args.json:
        print(json.dumps(summary(outcome), indent=2, allow_nan=False))
    else:
        print_report(report_console(), outcome)
    return 1 if outcome.result.verdict == "infra_abort" else 0
