"""`trm diagnose`: label a run's items with an LLM, one `question_diagnosed` event per label.

This module is the command: it parses arguments, reads the settings (`LLMSettings` from env /
`.env`, overridden by --base-url / --model) and reports. The package's other modules, one job each:

- `inputs`: the items file (JSONL), checked whole;
- `template`: the prompt template, rendered per item;
- `tiers`: the tier list, and the tier read from an answer;
- `client`: the governed client the settings describe;
- `job`: the labelling job, resumable after a crash.

`job` and `client` (and so trm_llm) are imported when the command runs, so the other `trm`
commands never load them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from trm_store.bootstrap import open_store
from trm_store.cli.common import counts_text, int_in_range, progress_bar, report_console
from trm_store.cli.diagnose.inputs import Item, load_items
from trm_store.cli.diagnose.template import PromptTemplate
from trm_store.cli.diagnose.tiers import parse_tiers
from trm_store.domain._common import check_id
from trm_store.domain.llm_calls import llm_stats

if TYPE_CHECKING:
    from trm_llm import LLMSettings
    from trm_store.cli.diagnose.job import Summary
    from trm_store.store import Store

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "diagnose",
        help="label items with an LLM, one event per label; resumable after a crash",
        description='For each item of FILE.jsonl ({"question_id": ..., ...fields}) not yet '
        "diagnosed for the run, ask the LLM for one tier and record it at once as an event on "
        "diagnosis:{run_id}. A rerun skips what is done; --retry-uncertain also redoes the items "
        "whose latest tier is `uncertain`. Exit 0 when every item is done, 1 when some calls "
        "failed (nothing recorded for them: rerun), 2 on bad input or a fatal LLM error, 130 "
        "when interrupted (Ctrl-C). An answer holding a NUL or a split surrogate is recorded "
        "as `uncertain` (detail.parse `poison`).",
    )
    parser.add_argument("--run-id", required=True, help="the run whose items are diagnosed")
    parser.add_argument("--items", required=True, type=Path, metavar="FILE.jsonl")
    parser.add_argument(
        "--retry-uncertain",
        action="store_true",
        help="diagnose again the items whose latest tier is `uncertain` (with a fresh sample)",
    )
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument("--base-url", help="OpenAI-compatible base URL (default: $LLM_BASE_URL)")
    parser.add_argument("--model", help="model name (default: $LLM_MODEL)")
    parser.add_argument(
        "--template",
        type=Path,
        metavar="FILE",
        help="prompt template: $fields, $tiers, $question_id, $<field> (default: a built-in one)",
    )
    parser.add_argument(
        "--tiers",
        default="correct,wrong,uncertain",
        help="comma-separated answers the LLM may give; must include `uncertain` "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency", type=int_in_range(1), default=4, help="calls in flight (default: 4)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trm_llm import LLMSettingsError

    # Everything is checked before the store is opened: bad input writes nothing.
    check_id("run_id", args.run_id)
    tiers = parse_tiers(args.tiers)
    template = PromptTemplate.load(args.template, tiers)
    items = load_items(args.items)
    template.check(items)
    try:
        settings = _settings(args.base_url, args.model)
    except LLMSettingsError as e:
        lines = (line.strip() for line in str(e).splitlines())
        message = " ".join(x for x in lines if x and not x.startswith("For further information"))
        print(
            f"trm: LLMSettingsError: {message} (set them in the environment or .env, or pass "
            "--base-url / --model)",
            file=sys.stderr,
        )
        return 2
    try:
        return _run_job(args, settings, template, items)
    except KeyboardInterrupt:
        print("trm diagnose: interrupted (what was recorded is kept; run again)", file=sys.stderr)
        return 130


def _run_job(
    args: argparse.Namespace,
    settings: LLMSettings,
    template: PromptTemplate,
    items: Sequence[Item],
) -> int:
    from trm_llm import StoreEventSink, client_from_settings
    from trm_store.cli.diagnose import job

    console = Console(stderr=True)
    with open_store(args.db) as store:
        sink, start = StoreEventSink.in_child_process(args.db), store.head_position()
        with progress_bar(console, transient=args.json) as progress, closing(sink):
            task = progress.add_task(f"diagnosing {args.run_id}", total=None)

            async def main() -> tuple[Summary, str]:
                async with client_from_settings(settings, sink=sink) as client:
                    done = await job.diagnose(
                        store,
                        client,
                        items,
                        run_id=args.run_id,
                        template=template,
                        retry_uncertain=args.retry_uncertain,
                        concurrency=args.concurrency,
                        on_item=lambda: progress.advance(task),
                        on_start=lambda todo: progress.update(task, total=todo),
                    )
                    return done, client.source

            summary, source = asyncio.run(main())
        calls = _calls_since(store, source, start)
        return _report(summary, calls, store.url, as_json=args.json)


def _settings(base_url: str | None, model: str | None) -> LLMSettings:
    from trm_llm import LLMSettings

    overrides = {"llm_base_url": base_url, "llm_model": model}
    return LLMSettings(**{k: v for k, v in overrides.items() if v is not None})


def _calls_since(store: Store, source: str, start: int) -> dict[str, Any]:
    """The calls the job's source recorded while it ran, as `llm_stats` counts them (a process
    calling through the same source at the same time would be counted too)."""
    stats = llm_stats(store, after=start).get(source)
    return {
        "calls": 0 if stats is None else stats["calls"],
        "cache_hits": 0 if stats is None else stats["cache_hits"],
        "retries": 0 if stats is None else stats["retries"],
        "failed_attempts_by_reason": {} if stats is None else stats["attempt_reasons"],
    }


def _report(summary: Summary, calls: dict[str, Any], url: str, *, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"store": url, **summary.as_dict(), "llm": calls}))
    else:
        _print(report_console(), summary, calls, url)
    if summary.stopped is not None:
        print(f"trm: stopped early: {summary.stopped}", file=sys.stderr)
    if summary.fatal:
        return 2
    return 1 if summary.failed or summary.not_started else 0


def _print(console: Console, summary: Summary, calls: dict[str, Any], url: str) -> None:
    console.print(
        f"[bold]run {summary.run_id}[/]: {summary.items} items, {summary.skipped_done} skipped "
        f"as done, {summary.diagnosed} diagnosed now  ({url})"
    )
    if summary.tiers:
        table = Table()
        table.add_column("tier")
        table.add_column("diagnosed now", justify="right")
        for tier, count in sorted(summary.tiers.items()):
            table.add_row(tier, str(count))
        console.print(table)
    if summary.poison:
        console.print(
            "recorded as uncertain, the answer holding characters the log cannot keep: "
            + counts_text(summary.poison)
        )
    if summary.unparsed:
        console.print(
            "recorded as uncertain, the answer naming no single tier: "
            + counts_text(summary.unparsed)
        )
    line = (
        f"LLM: {calls['calls']} calls, {calls['cache_hits']} cache hits, {calls['retries']} retries"
    )
    if calls["failed_attempts_by_reason"]:
        line += f"; failed attempts: {counts_text(calls['failed_attempts_by_reason'])}"
    console.print(line)
    if summary.failed or summary.not_started:
        console.print(
            f"[yellow]not diagnosed[/]: {sum(summary.failed.values())} failed "
            f"({counts_text(summary.failed)}), {summary.not_started} not started; nothing was "
            "recorded for them: run again"
        )
