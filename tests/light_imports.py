"""Which heavy libraries an import statement loads, seen from a fresh interpreter (issue 13: `import
trm_llm` and `import trm_gate` must load no database library)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("sqlalchemy", "alembic", "psycopg")


def heavy_modules_loaded(statement: str) -> list[str]:
    """The top-level HEAVY modules in `sys.modules` after running `statement` in a new process."""
    probe = (
        "import json, sys\n"
        f"{statement}\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded
