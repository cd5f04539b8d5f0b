"""Chromium for the dashboard tests and benchmarks: Debian's binary (PARALAB_CHROMIUM), never a
download."""

from __future__ import annotations

import os

CHROMIUM = os.environ.get("PARALAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]


def launch_chromium(pw):
    return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
