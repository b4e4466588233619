"""`python -m trm_store.cli ARGS` runs `trm ARGS`."""

from trm_store.cli import main

raise SystemExit(main())
