"""`trm diagnose`: label a run's items with an LLM, one `question_diagnosed` event per label.

The job itself is `trm_store.diagnose_job`; this module parses arguments, builds the governed
client from `LLMSettings` (env / `.env`, overridden by --base-url / --model) and reports. trm_llm
is imported inside functions only, so the other `trm` commands never load it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from trm_store.bootstrap import open_store
from trm_store.cli_common import int_in_range, progress_bar, report_console
from trm_store.domain._common import check_id

if TYPE_CHECKING:
    from trm_llm import GovernedLLMClient, LLMSettings
    from trm_llm.protocols import EventSink
    from trm_store.diagnose_job import Summary, TallyingSink

__all__ = ["add_parser", "governed_client", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "diagnose",
        help="label items with an LLM, one event per label; resumable after a crash",
        description='For each item of FILE.jsonl ({"question_id": ..., ...fields}) not yet '
        "diagnosed for the run, ask the LLM for one tier and record it at once as an event on "
        "diagnosis:{run_id}. A rerun skips what is done; --retry-uncertain also redoes the items "
        "whose latest tier is `uncertain`. Exit 0 when every item is done, 1 when some calls "
        "failed (nothing recorded for them: rerun), 2 on bad input or a fatal LLM error.",
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
    from trm_llm import LLMSettingsError, StoreEventSink
    from trm_store import diagnose_job as job

    # Everything is checked before the store is opened: bad input writes nothing.
    check_id("run_id", args.run_id)
    tiers = job.parse_tiers(args.tiers)
    template = job.PromptTemplate.load(args.template, tiers)
    items = job.load_items(args.items)
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
    console = Console(stderr=True)
    with open_store(args.db) as store:
        sink = job.TallyingSink(StoreEventSink(store))
        with progress_bar(console, transient=args.json) as progress:
            task = progress.add_task(f"diagnosing {args.run_id}", total=None)

            async def main() -> Summary:
                async with governed_client(settings, sink) as client:
                    return await job.diagnose(
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

            summary = asyncio.run(main())
        return _report(summary, sink, store.url, as_json=args.json)


def _settings(base_url: str | None, model: str | None) -> LLMSettings:
    from trm_llm import LLMSettings

    overrides = {"llm_base_url": base_url, "llm_model": model}
    return LLMSettings(**{k: v for k, v in overrides.items() if v is not None})


@asynccontextmanager
async def governed_client(
    settings: LLMSettings, sink: EventSink | None
) -> AsyncIterator[GovernedLLMClient]:
    """The client `settings` describe (cache, breaker, retries), closed with what it opened."""
    import redis
    import redis.asyncio

    from trm_llm import (
        CircuitBreaker,
        GovernedLLMClient,
        RedisResponseCache,
        RetryPolicy,
        SqliteResponseCache,
    )
    from trm_llm.cache import ResponseCache

    async with AsyncExitStack() as stack:
        cache: ResponseCache | None = None
        ttl, namespace = settings.redis_cache_ttl, settings.llm_cache_namespace
        if settings.llm_cache_backend == "sqlite":
            path = settings.llm_cache_sqlite_path
            cache = SqliteResponseCache(path, ttl_s=ttl, namespace=namespace, sink=sink)
        elif settings.llm_cache_backend == "redis":
            async_redis = redis.asyncio.Redis.from_url(str(settings.redis_url))
            stack.push_async_callback(async_redis.aclose)
            cache = RedisResponseCache(async_redis, ttl_s=ttl, namespace=namespace, sink=sink)
        shared = None
        if settings.llm_breaker_shared:
            shared = redis.Redis.from_url(str(settings.redis_url))
            stack.callback(shared.close)
        breaker = CircuitBreaker(
            settings.llm_breaker_fail_threshold,
            settings.llm_breaker_cooldown_s,
            settings.llm_breaker_probe_timeout_s,
            redis_client=shared,
        )
        retry = RetryPolicy(
            max_attempts=settings.llm_max_attempts,
            base_delay_s=settings.llm_base_delay_s,
            max_delay_s=settings.llm_max_delay_s,
            deadline_s=settings.llm_deadline_s,
            retry_after_cap_s=settings.llm_retry_after_cap_s,
        )
        client = GovernedLLMClient(
            settings.llm_base_url,
            settings.llm_model,
            api_key=settings.llm_api_key,
            cache=cache,
            breaker=breaker,
            retry=retry,
            sink=sink,
            profile=settings.llm_profile,
            source=settings.llm_source,
            cache_length=settings.llm_cache_length,
            first_token_timeout_s=settings.llm_first_token_timeout_s,
            inter_token_timeout_s=settings.llm_inter_token_timeout_s,
        )
        stack.push_async_callback(client.aclose)
        yield client


def _report(summary: Summary, sink: TallyingSink, url: str, *, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"store": url, **summary.as_dict(), "llm": sink.as_dict()}))
    else:
        _print(report_console(), summary, sink, url)
    if summary.stopped is not None:
        print(f"trm: stopped early: {summary.stopped}", file=sys.stderr)
    if summary.fatal:
        return 2
    return 1 if summary.failed or summary.not_started else 0


def _counts(counter: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counter.items()))


def _print(console: Console, summary: Summary, sink: TallyingSink, url: str) -> None:
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
    if summary.unparsed:
        console.print(
            f"recorded as uncertain, the answer naming no single tier: {_counts(summary.unparsed)}"
        )
    line = f"LLM: {sink.calls} calls, {sink.cache_hits} cache hits, {sink.retries} retries"
    if sink.failed_attempts:
        line += f"; failed attempts: {_counts(sink.failed_attempts)}"
    console.print(line)
    if summary.failed or summary.not_started:
        console.print(
            f"[yellow]not diagnosed[/]: {sum(summary.failed.values())} failed "
            f"({_counts(summary.failed)}), {summary.not_started} not started; nothing was "
            "recorded for them: run again"
        )
