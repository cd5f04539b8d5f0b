"""httpx for the command line, without httpx's own command line: `import httpx` imports
httpx._main (its `httpx` console script), which imports click, rich and pygments, about 60 ms
of the CLI's 150 ms of imports (`python -X importtime -c "import backend.cli"`: httpx 131 ms,
its _main 61). A stand-in takes its place in this process, which never runs that script, so
every `paralab` command starts that much sooner (issue 44: the CLI's fixed overhead)."""

from __future__ import annotations

import sys
import types

if "httpx" not in sys.modules:  # (already imported whole: nothing left to spare)
    _stub = types.ModuleType("httpx._main")

    def _main() -> None:
        sys.exit("httpx's command line is not loaded in paralab's process")
    _stub.main = _main
    sys.modules.setdefault("httpx._main", _stub)

import httpx  # noqa: E402 - after the stand-in

__all__ = ["httpx"]
