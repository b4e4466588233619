"""`trm ui` as a real child process on a free loopback port, and a headless Chromium for it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.cli.helpers import ROOT, child_env, trm_command

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = Path(os.environ.get("TRM_SCREENSHOTS", ROOT / "build" / "screenshots"))
"""Where the browser tests write a screenshot of each page (test artefacts, not committed)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def trm_ui(
    url: str, cwd: Path, *extra: str, host: str = "127.0.0.1"
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`trm ui --db URL` running until the block ends; yields its base URL and the process."""
    port = free_port()
    process = subprocess.Popen(
        [*trm_command("ui", "--db", url, "--host", host, "--port", str(port)), *extra],
        cwd=cwd,
        env=child_env(cwd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise AssertionError(f"trm ui exited: {process.communicate()[1]}")
            try:
                httpx.get(f"{base}/favicon.ico", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield base, process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def browser() -> Iterator[object]:
    """Debian's chromium, headless, driven by playwright (no browser download)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"chromium is not installed at {CHROMIUM}: apt-get install -y chromium")
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield instance
        finally:
            instance.close()
