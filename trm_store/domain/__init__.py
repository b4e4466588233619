"""trm's own domain streams: each module here registers its event types and projections.

Every module in this package is imported by `load()`, which `open_store` calls, so a new domain
module takes part without being listed anywhere else.
"""

from __future__ import annotations

import importlib
import pkgutil

__all__ = ["load"]


def load() -> None:
    """Import every domain module (idempotent), registering its types and projections."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
