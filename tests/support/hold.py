"""Something for a child process to do until the test lets it go: a condition, not a
duration, so a loaded machine cannot end the hold before the test has looked."""

from __future__ import annotations

import time
from pathlib import Path


def until_exists(path: str, limit_s: float = 120.0) -> bool:
    """Block until `path` exists (True) or `limit_s` passed (False: a safety net that keeps a
    test that forgot to release from holding a process forever)."""
    end = time.monotonic() + limit_s
    while not Path(path).exists():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True
