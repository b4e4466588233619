"""The `trm ui` application: HTML pages and the JSON API under `/api`, on one read-only store.

Every page has a stable address (`/workspaces/{id}`, `/runs/{id}`, `/gates/{id}`,
`/llm/{source}`, `/projections`) and its data at the same address under `/api`; both come from
`trm_store.cli.ui.pages`. Pages follow the log live: `/api/stream` is a server-sent event
stream of the log's head position, and the page's script fetches its own address again (the
`main` element only) when the head moves. Endpoints are plain functions, so FastAPI runs them
in its thread pool: no database call ever runs on the event loop.

Safety: the store is opened read-only by the caller; templates escape every value (Jinja2
autoescape) and a Content-Security-Policy allows only this server's own script, so a payload
holding `<script>` shows as text and could not run; with a token, every request must carry it
(`Authorization: Bearer`, or once as `?token=`, which sets a cookie).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from pydantic import BaseModel

from trm_gate import to_e_value
from trm_store.cli.ui import pages
from trm_store.domain._common import json_default
from trm_store.domain.errors import DomainInputError, UnknownEntityError
from trm_store.errors import EventValidationError, StaleProjectionError, StoreError
from trm_store.store import Store

__all__ = ["create_app"]

HERE = Path(__file__).parent
COOKIE = "trm_token"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
POLL_S = 0.5
"""How often the event stream looks at the log's head (one indexed read)."""

Sort = Literal["seq", "question_id", "unit_id", "correct", "stop_reason"]
Offset = Annotated[int, Query(ge=0, le=2**62)]
Limit = Annotated[int, Query(ge=1, le=500)]


def prediction_filters(
    unit: str | None = None,
    correct: bool | None = None,
    stop_reason: str | None = None,
    sort: Sort = "seq",
    desc: bool = False,
    offset: Offset = 0,
    limit: Limit = 50,
) -> dict[str, Any]:
    """A run page's query parameters (the same for its HTML and its JSON): the filters, sort and
    page of `predictions_page`; an empty field of the page's form means no filter."""
    return {
        "unit_id": unit or None,
        "correct": correct,
        "stop_reason": stop_reason or None,
        "sort": sort,
        "descending": desc,
        "offset": offset,
        "limit": limit,
    }


Filters = Annotated[dict[str, Any], Depends(prediction_filters)]


class Problem(BaseModel):
    """Why a request failed: the typed error's name and message."""

    detail: str


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "an argument is invalid (DomainInputError)"},
    401: {"model": Problem, "description": "a token is required and was not given"},
    404: {"model": Problem, "description": "no such workspace, run, gate or source"},
    503: {"model": Problem, "description": "a projection is stale: `trm replay-projections`"},
}


def _finite(value: Any) -> Any:
    """`value` with every non-finite float as None: JSON has no infinity (an e-value past a
    float's range is null, as in `trm gate-report --json`)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _to_json(data: Any) -> Any:
    """Data as JSON values, as the API sends them and the templates draw them: times as
    ISO 8601, no NaN or infinity."""
    return json.loads(json.dumps(_finite(data), default=json_default, allow_nan=False))


def _pager(params: Any, offset: int) -> str:
    """The page's query string with `offset` replaced (the previous / next page's link)."""
    pairs = [(k, v) for k, v in params.multi_items() if k != "offset"]
    return urlencode([*pairs, ("offset", str(offset))])


def create_app(store: Store, *, token: str | None = None, poll_s: float = POLL_S) -> FastAPI:
    """The web view of `store` (which the caller opened read-only and closes)."""
    app = FastAPI(
        title="trm",
        summary="The event log's workspaces, runs, gates and LLM health, read-only.",
        docs_url="/api/docs",
        openapi_url="/api/openapi.json",
        redoc_url=None,
        responses=ERRORS,
    )
    environment = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True)
    templates = Jinja2Templates(env=environment)
    templates.env.filters["pager"] = _pager
    # JSON as text for the page (autoescape escapes it there), not `tojson`'s \u0027 escapes.
    templates.env.filters["json_text"] = lambda value: json.dumps(value, ensure_ascii=False)
    templates.env.filters["e_value"] = lambda log_e: (
        to_e_value(log_e) if log_e is not None else math.inf
    )
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @app.middleware("http")
    async def guard(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        given = request.query_params.get("token")
        if token is not None:
            header = request.headers.get("authorization", "")
            offered = (
                (header.removeprefix("Bearer ") if header.startswith("Bearer ") else None)
                or request.cookies.get(COOKIE)
                or given
            )
            if offered is None or not hmac.compare_digest(offered.encode(), token.encode()):
                return JSONResponse({"detail": "a valid token is required"}, status_code=401)
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        if token is not None and given is not None:
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError) -> Response:
        status = 500
        if isinstance(exc, UnknownEntityError):
            status = 404
        elif isinstance(exc, DomainInputError | EventValidationError):
            status = 400
        elif isinstance(exc, StaleProjectionError):
            status = 503
        detail = f"{type(exc).__name__}: {exc}"
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": detail}, status_code=status)
        context = {"status": status, "detail": detail, "head": 0, "fragment": False}
        error_page: Response = templates.TemplateResponse(
            request, "error.html", context, status_code=status
        )
        return error_page

    def page(build: Callable[..., Any], template: str) -> Callable[..., Response]:
        """An HTML page drawing `build`'s data: the whole page, or only its `main` element
        when the page's own script asks (to follow the log without a reload)."""

        def render(request: Request, *args: Any, **kwargs: Any) -> Response:
            data = _to_json(build(store, *args, **kwargs))
            fragment = request.headers.get("x-trm-fragment") == "1"
            context = {"data": data, "head": store.head_position(), "fragment": fragment}
            response: Response = templates.TemplateResponse(request, template, context)
            return response

        return render

    overview, workspace, runs, run = (
        page(pages.overview_page, "overview.html"),
        page(pages.workspace_page, "workspace.html"),
        page(pages.runs_page, "runs.html"),
        page(pages.run_page, "run.html"),
    )
    gates, gate, llm, llm_source, projections = (
        page(pages.gates_page, "gates.html"),
        page(pages.gate_page, "gate.html"),
        page(pages.llm_page, "llm.html"),
        page(pages.llm_source_page, "llm_source.html"),
        page(pages.projections_page, "projections.html"),
    )

    # -- HTML ---------------------------------------------------------------------------------

    def html(path: str) -> Callable[[Callable[..., Response]], Callable[..., Response]]:
        """A page's route: HTML, and not in the API's schema (its data is, under /api)."""
        return app.get(path, response_class=HTMLResponse, include_in_schema=False)

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(status_code=204)  # none: the browser's request is not an error

    @html("/")
    def overview_html(request: Request) -> Response:
        return overview(request)

    @html("/workspaces/{workspace_id:path}")
    def workspace_html(request: Request, workspace_id: str) -> Response:
        return workspace(request, workspace_id)

    @html("/runs")
    def runs_html(request: Request) -> Response:
        return runs(request)

    @html("/runs/{run_id:path}")
    def run_html(request: Request, run_id: str, filters: Filters) -> Response:
        return run(request, run_id, **filters)

    @html("/gates")
    def gates_html(request: Request) -> Response:
        return gates(request)

    @html("/gates/{gate_id:path}")
    def gate_html(request: Request, gate_id: str) -> Response:
        return gate(request, gate_id)

    @html("/llm")
    def llm_html(request: Request) -> Response:
        return llm(request)

    @html("/llm/{source:path}")
    def llm_source_html(request: Request, source: str) -> Response:
        return llm_source(request, source)

    @html("/projections")
    def projections_html(request: Request) -> Response:
        return projections(request)

    # -- JSON ---------------------------------------------------------------------------------

    @app.get("/api/overview")
    def overview_api() -> dict[str, Any]:
        """Workspaces, the latest runs and gates, the LLM sources, the log's head."""
        return _to_json(pages.overview_page(store))  # type: ignore[no-any-return]

    @app.get("/api/workspaces/{workspace_id:path}")
    def workspace_api(workspace_id: str) -> dict[str, Any]:
        """A workspace's manifest, runs by epoch with verdicts, final metrics over epochs."""
        return _to_json(pages.workspace_page(store, workspace_id))  # type: ignore[no-any-return]

    @app.get("/api/runs")
    def runs_api() -> dict[str, Any]:
        """Every run, newest first."""
        return _to_json(pages.runs_page(store))  # type: ignore[no-any-return]

    @app.get("/api/runs/{run_id:path}")
    def run_api(run_id: str, filters: Filters) -> dict[str, Any]:
        """A run, its totals and diagnoses, and one page of its predictions."""
        return _to_json(pages.run_page(store, run_id, **filters))  # type: ignore[no-any-return]

    @app.get("/api/gates")
    def gates_api() -> dict[str, Any]:
        """Every gate, most recently started first."""
        return _to_json(pages.gates_page(store))  # type: ignore[no-any-return]

    @app.get("/api/gates/{gate_id:path}")
    def gate_api(gate_id: str) -> dict[str, Any]:
        """A gate's report, status and e-value chart."""
        return _to_json(pages.gate_page(store, gate_id))  # type: ignore[no-any-return]

    @app.get("/api/llm")
    def llm_api() -> dict[str, Any]:
        """Every LLM source's figures."""
        return _to_json(pages.llm_page(store))  # type: ignore[no-any-return]

    @app.get("/api/llm/{source:path}")
    def llm_source_api(source: str) -> dict[str, Any]:
        """One LLM source's figures and breaker timeline."""
        return _to_json(pages.llm_source_page(store, source))  # type: ignore[no-any-return]

    @app.get("/api/projections")
    def projections_api() -> dict[str, Any]:
        """Each projection's version, checkpoint, distance behind the head, status."""
        return _to_json(pages.projections_page(store))  # type: ignore[no-any-return]

    @app.get("/api/head")
    def head_api() -> dict[str, int]:
        """The log's head position."""
        return {"position": store.head_position()}

    @app.get("/api/stream", response_class=StreamingResponse)
    async def stream(after: Annotated[int, Query(ge=0, le=2**62)] = 0) -> StreamingResponse:
        """Server-sent events: `head` with the new position each time the log grows past
        `after` (checked every half second)."""

        async def events() -> AsyncIterator[str]:
            seen = after
            yield "retry: 1000\n\n"
            while True:
                position = await asyncio.to_thread(store.head_position)
                if position > seen:
                    seen = position
                    yield f"event: head\ndata: {json.dumps({'position': position})}\n\n"
                await asyncio.sleep(poll_s)

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    return app
