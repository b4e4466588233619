"""Whether a lease's holder is known to be gone: a process on this host whose pid no longer
exists. Shared by run and gate leases; anything else (another host, a pid we may not signal, a
pid reused by a new process) is left to the age threshold."""

from __future__ import annotations

import os
import socket

__all__ = ["holder_gone"]


def holder_gone(host: str | None, pid: int | None) -> bool:
    """True if `pid` on `host` is this host's and no process has that pid any more."""
    if host != socket.gethostname() or pid is None or pid <= 0:
        return False  # pid 0 or below would signal a process group, never ask about those
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists, owned by someone else (PermissionError), or cannot be told
    return False
