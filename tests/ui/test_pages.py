"""`trm ui` in a real headless Chromium, on a store filled by `trm demo`: every page shows what
the store holds, hostile strings stay text, pages follow the log live, nothing is written."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.demo_store import HOSTILE, HOSTILE_RUN, DemoStore
from tests.ui.server import SCREENSHOTS, browser, trm_ui
from trm_store import RunLog, open_store
from trm_store.domain.gates import list_gates
from trm_store.domain.llm_calls import breaker_transitions, llm_stats
from trm_store.domain.runs import run_info


@pytest.fixture(scope="module")
def served(demo_store: DemoStore) -> Iterator[str]:
    with trm_ui(demo_store.url, demo_store.folder) as (base, _):
        yield base


@pytest.fixture(scope="module")
def page(served: str) -> Iterator[Any]:
    with browser() as chromium:
        tab = chromium.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
        errors: list[str] = []
        tab.on("pageerror", lambda error: errors.append(str(error)))
        tab.errors = errors
        yield tab


def _open(page: Any, base: str, path: str, name: str) -> None:
    response = page.goto(base + path)
    assert response.status == 200, (path, response.status)
    page.wait_for_selector("#live.on", timeout=10_000)  # the live stream is connected
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    assert page.errors == []


def test_gate_page_shows_the_verdict_wl_and_the_chart(
    page: Any, served: str, demo_store: DemoStore
) -> None:
    with open_store(demo_store.url, read_only=True) as store:
        gate = list_gates(store)[0]
    _open(page, served, f"/gates/{quote(gate['gate_id'])}", "gate")
    assert page.inner_text("#verdict") == gate["verdict"]
    assert page.inner_text("#wlt") == f"{gate['wins']} / {gate['losses']} / {gate['ties']}"
    assert page.locator("table.blocks tbody tr").count() == gate["blocks"]
    assert page.locator("figure.chart polyline").count() == 2  # E+ and E-
    assert page.locator("figure.chart line.threshold").count() == 2  # 1/alpha and 1/beta


def test_run_page_counts_filters_and_pages_predictions(
    page: Any, served: str, demo_store: DemoStore
) -> None:
    with open_store(demo_store.url, read_only=True) as store:
        run = next(r for r in _runs(store) if r.endswith("-baseline"))
        info = run_info(store, run)
    _open(page, served, f"/runs/{quote(run)}", "run")
    assert page.inner_text("#predictions-count") == str(info["predictions"])
    assert page.locator("table.predictions tbody tr").count() == min(50, info["predictions"])
    page.select_option("select[name=correct]", "true")
    page.click("button[type=submit]")
    page.wait_for_load_state()
    cells = page.locator("table.predictions tbody td.correct-True").count()
    rows = page.locator("table.predictions tbody tr").count()
    assert rows == cells > 0
    if info["predictions"] > 50:
        page.goto(f"{served}/runs/{quote(run)}")
        page.click("a[rel=next]")
        assert "showing 51–" in page.inner_text("#page-summary")


def test_llm_page_shows_breaker_transitions(page: Any, served: str, demo_store: DemoStore) -> None:
    with open_store(demo_store.url, read_only=True) as store:
        source = sorted(llm_stats(store))[0]
        transitions = breaker_transitions(store, source=source)
    _open(page, served, "/llm", "llm")
    assert source in page.inner_text("table.llm")
    _open(page, served, f"/llm/{quote(source)}", "llm-source")
    assert transitions, "the demo's outage opens the breaker"
    assert page.locator("#breaker-timeline li").count() == len(transitions)
    assert "open" in page.inner_text("#breaker-timeline")


def test_workspace_overview_and_projection_pages(
    page: Any, served: str, demo_store: DemoStore
) -> None:
    _open(page, served, "/", "overview")
    assert demo_store.workspace_id in page.inner_text("main")
    _open(page, served, f"/workspaces/{demo_store.workspace_id}", "workspace")
    assert page.locator("table.epoch tbody tr").count() == 2  # baseline and candidate
    _open(page, served, "/runs", "runs")
    _open(page, served, "/gates", "gates")
    _open(page, served, "/projections", "projections")
    assert page.locator("table.projections tbody tr").count() >= 5
    assert "ready" in page.inner_text("table.projections")


def test_hostile_strings_are_text_never_markup(page: Any, served: str) -> None:
    _open(page, served, f"/runs/{quote(HOSTILE_RUN, safe='')}", "hostile-run")
    assert page.evaluate("typeof window.__pwned") == "undefined"  # no script ran
    assert page.locator("table.predictions img").count() == 0  # no element was injected
    shown = page.inner_text("table.predictions")
    for text in HOSTILE:
        assert text.replace("\n", " ").split()[0] in shown
    assert HOSTILE_RUN in page.inner_text("h1")


def test_a_page_follows_the_log_live(page: Any, served: str, demo_store: DemoStore) -> None:
    run_id = f"live-{time.time_ns()}"
    with open_store(demo_store.url) as store, RunLog(store, run_id) as log:
        log.record_prediction("q0", unit_id="u", prediction="1", correct=True, stop_reason="stop")
        log.flush()
        _open(page, served, f"/runs/{quote(run_id)}", "live-run")
        assert page.inner_text("#predictions-count") == "1"
        started = time.monotonic()
        for i in range(1, 4):
            log.record_prediction(
                f"q{i}", unit_id="u", prediction="2", correct=False, stop_reason="stop"
            )
        log.flush()
        _expect().expect(page.locator("#predictions-count")).to_have_text("4", timeout=15_000)
        seen_after = time.monotonic() - started
    print(f"live update seen {seen_after:.2f}s after the commit")  # the target (2 s) is a bench's
    status = page.locator("main .status").first
    _expect().expect(status).to_have_text("completed", timeout=15_000)


def test_nothing_a_request_can_do_writes(served: str, demo_store: DemoStore) -> None:
    with open_store(demo_store.url, read_only=True) as store:
        head = store.head_position()
        status = store.projection_status()
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        for path in ("/", "/api/runs", f"/api/runs/{quote(HOSTILE_RUN, safe='')}"):
            response = httpx.request(method, served + path)
            assert response.status_code == 405, (method, path)
    for path in ("/", "/runs", "/gates", "/llm", "/projections", "/api/overview"):
        assert httpx.get(served + path).status_code == 200
    with open_store(demo_store.url, read_only=True) as store:
        assert store.head_position() == head
        assert store.projection_status() == status


def test_every_page_is_json_under_api_with_a_schema(served: str) -> None:
    schema = httpx.get(f"{served}/api/openapi.json").json()
    paths = set(schema["paths"])
    for path in ("/api/runs/{run_id}", "/api/gates/{gate_id}", "/api/llm/{source}"):
        assert path in paths
    assert httpx.get(f"{served}/api/runs/nope").status_code == 404
    bad = httpx.get(f"{served}/api/runs/x", params={"limit": 501})
    assert bad.status_code == 422
    csp = httpx.get(f"{served}/").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp


def test_a_token_guards_every_request(demo_store: DemoStore, tmp_path: Path) -> None:
    with trm_ui(demo_store.url, tmp_path, "--token", "s3cret") as (base, _):
        assert httpx.get(f"{base}/api/runs").status_code == 401
        assert httpx.get(f"{base}/").status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert httpx.get(f"{base}/api/runs", headers=good).status_code == 200
        wrong = {"Authorization": "Bearer s3cre"}
        assert httpx.get(f"{base}/api/runs", headers=wrong).status_code == 401
        with httpx.Client() as client:
            assert client.get(f"{base}/?token=s3cret").status_code == 200
            assert client.get(f"{base}/runs").status_code == 200  # the cookie it set


def test_a_host_other_than_loopback_warns(demo_store: DemoStore, tmp_path: Path) -> None:
    with trm_ui(demo_store.url, tmp_path, host="127.0.0.2") as (_, process):
        pass
    assert "warning: serving on 127.0.0.2" in process.stderr.read()  # type: ignore[union-attr]


def _expect() -> Any:
    return pytest.importorskip("playwright.sync_api")


def _runs(store: Any) -> list[str]:
    from datetime import UTC, datetime

    from trm_store.domain.run_list import list_runs

    return [r["run_id"] for r in list_runs(store, now=datetime.now(UTC))]
