"""`trm ui`: a live web view of the store (workspaces, runs, gates, LLM health, projections).

Opens the store read-only and serves `trm_store.cli.ui.app` with uvicorn on 127.0.0.1 unless
--host says otherwise (then it warns, and --token, or $TRM_UI_TOKEN, can require a bearer
token). Pages follow the log live; every page's data is at the same address under `/api`, with
its OpenAPI schema at `/api/openapi.json`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from trm_store.bootstrap import open_store
from trm_store.cli.common import int_in_range

__all__ = ["LOOPBACK", "add_parser", "run"]

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "ui",
        help="serve a live, read-only web view of the store",
        description="Serve a read-only web view of the store: workspaces, runs (with their "
        "predictions), gates (with their e-value paths), LLM health per source, projections. "
        "Pages update as events arrive. The JSON behind every page is under /api "
        "(schema: /api/openapi.json).",
    )
    parser.add_argument("--db", help="store URL (default: $TRM_STORE_URL, then sqlite:///trm.db)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int_in_range(0, 65535), default=8080)
    parser.add_argument(
        "--token",
        default=os.environ.get("TRM_UI_TOKEN"),
        help="require this bearer token on every request (default: $TRM_UI_TOKEN)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:  # the `ui` extra (uvicorn, FastAPI, Jinja2), loaded only for `trm ui`
        import uvicorn

        from trm_store.cli.ui.app import create_app
    except ImportError as exc:
        print(f"trm: trm ui needs the ui extra: pip install 'trm[ui]' ({exc})", file=sys.stderr)
        return 2

    if args.host not in LOOPBACK:
        guard = "a token is required" if args.token else "anyone who can reach it can read it"
        print(f"trm: warning: serving on {args.host}, not loopback: {guard}", file=sys.stderr)
    with open_store(args.db, read_only=True) as store:
        app = create_app(store, token=args.token)
        shown = f"[{args.host}]" if ":" in args.host else args.host
        print(f"trm ui: http://{shown}:{args.port}/ ({store.url}, read-only)", file=sys.stderr)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
