"""The soak as a regression check: `bench/soak.py --quick` (both backends, ~25 s each, workers
SIGKILLed and restarted under faults) must find no violation of its invariants."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


@pytest.mark.slow
def test_quick_soak_finds_no_violation() -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = done.stdout + done.stderr
    counts = re.findall(r"^violations: (\d+)$", done.stdout, re.MULTILINE)
    assert counts == ["0"], report
    assert done.returncode == 0, report
    # Both backends ran, and each was really soaked: workers were killed and restarted.
    kills = [int(k) for k in re.findall(r"^   kills (\d+) ", done.stdout, re.MULTILINE)]
    assert len(kills) == 2 and min(kills) > 0, report
