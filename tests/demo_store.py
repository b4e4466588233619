"""One store filled by `trm demo` for the whole session, plus runs of hostile strings: shared by
the export, CLI and web view tests (a demo run costs ~20 s)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.cli.helpers import child_env, trm_command
from trm_store import RunLog, open_store, write_dual_metric

HOSTILE = [
    "[/]",
    "[bold red]x[/]",
    "<script>window.__pwned = 1</script>",
    '"><img src=x onerror="window.__pwned = 2">',
    "a,b\nc",
]
"""Predictions that are rich markup, HTML and CSV syntax: every view must show them as text."""

HOSTILE_RUN = "hostile-[/]<b>"
HOSTILE_CORRECT = [True, False, True, False, True]


@dataclass(frozen=True)
class DemoStore:
    url: str
    folder: Path
    workspace_id: str = "trm-demo"


def make_demo_store(folder: Path) -> DemoStore:
    """Run `trm demo` in `folder`, then add a run of HOSTILE predictions (and one INFRA)."""
    demo = subprocess.run(
        trm_command("demo"),
        cwd=folder,
        env=child_env(folder),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stderr
    url = f"sqlite:///{folder / 'trm.db'}"
    with open_store(url) as store:
        with RunLog(store, HOSTILE_RUN, config={"lr": 1.0, "big": 2**62}) as log:
            for i, (text, correct) in enumerate(zip(HOSTILE, HOSTILE_CORRECT, strict=True)):
                log.record_prediction(
                    f"q{i}", unit_id="u", prediction=text, correct=correct, stop_reason="stop"
                )
            log.record_prediction(
                "q-infra", unit_id="u", prediction=None, correct=None, stop_reason="error"
            )
        write_dual_metric(
            store,
            run_id=HOSTILE_RUN,
            epoch=0,
            version_kind="final",
            skills_version="s",
            prompts_version="p",
            pool="pool",
            hard_acc=0.5,
        )
    return DemoStore(url, folder)
