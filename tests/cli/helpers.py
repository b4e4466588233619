"""Shared by the CLI tests: `trm` as a child process, a tier-answering LLM server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from trm_llm.simulated_server import Reply, SimulatedServer, normal

ROOT = Path(__file__).resolve().parents[2]
_OURS = ("LLM_", "REDIS_", "TRM_")
_SAY = re.compile(r"\[\[say:([^\]]*)\]\]")


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a `trm` child: no inherited LLM_*/REDIS_*/TRM_* settings, the
    response cache in tmp_path, no backoff sleeps, and the repo importable from any cwd."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    env.update(
        PYTHONPATH=str(ROOT),
        LLM_CACHE_SQLITE_PATH=str(tmp_path / "llm_cache.db"),
        LLM_BASE_DELAY_S="0",
        LLM_MAX_DELAY_S="0",
        **extra,
    )
    return env


def use_child_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **extra: str) -> None:
    """Make this process look like a `trm` child (`child_env`, cwd tmp_path): in-process runs."""
    for name in list(os.environ):
        if name.startswith(_OURS):
            monkeypatch.delenv(name)
    for name, value in child_env(tmp_path, **extra).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)


def trm_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "trm_store.cli", *args]


def trm(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `trm ARGS` to the end (cwd is a temporary directory: no stray `.env` is read)."""
    return subprocess.run(
        trm_command(*args),
        cwd=cwd,
        env=dict(env) if env is not None else child_env(cwd),
        capture_output=True,
        text=True,
        timeout=120,
    )


def write_items(path: Path, items: Iterable[Mapping[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


class TierServer(SimulatedServer):
    """Answers each request with the text of the `[[say:TEXT]]` marker in its prompt (after
    `delay_s`), so an item's field decides the LLM's verdict; counts requests per marker."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s
        self._seen = threading.Condition()

    def respond(self, body: Any) -> Reply:
        with self._seen:
            self._seen.notify_all()
        match = _SAY.search(body["messages"][-1]["content"])
        answer = match.group(1) if match else "no marker"
        reply = normal([answer])
        return Reply(reply.status, reply.headers, (self.delay_s, *reply.steps), reply.ending)

    def wait_for_requests(self, count: int, timeout_s: float) -> bool:
        """Block until `count` requests arrived (False if `timeout_s` passed first)."""
        with self._seen:
            return self._seen.wait_for(lambda: self.request_count >= count, timeout_s)

    def prompts(self) -> list[str]:
        """The last user message of every request, in arrival order."""
        return [r.body["messages"][-1]["content"] for r in self.requests]
