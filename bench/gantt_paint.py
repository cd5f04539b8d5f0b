"""Gantt first paint of a large converted run (issue 19): the time of the run page's first
Gantt request (GET /api/runs/{id}/gantt without a step: backend/services/gantt_columnar.py reads the
middle step's records from the Parquet files), cold (a fresh process: imports, DuckDB over
the files, the step list) and warm (the same request again), plus a zoomed time window and
the JSON size the browser parses.

    .venv/bin/python bench/gantt_paint.py --ranks 8 --records 5M,50M

What is timed is the backend's answer, the part that grows with the run; the browser's
drawing of the bounded answer (at most max_spans segments) does not grow with it.

    .venv/bin/python bench/gantt_paint.py --ranks 8 --records 5M,50M --browser

--browser times what the user waits for: a real `paralab serve` (fresh SQLite database), a run
whose Parquet files are put in its folder as the worker's conversion leaves them, and Debian's
headless Chromium (Playwright) opening the run page at 1280x800: navigation start -> the Gantt
drawn and its zoom handler bound (`#gantt[data-ready]`, bench/gantt_render.py's measure). Cold:
the first load after the server started (nothing of the run cached); warm: reloads.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.analysis_speed import PER_STEP, make_parquet, parse_count  # noqa: E402


def child(d: str) -> None:
    t0 = time.perf_counter()
    from backend.services import gantt_columnar as G  # imports count: they are part of a cold start
    run = Path(d)
    assert G.covers(run)
    out = {}
    first = G.answer(run, step=None, t0_ms=None, t1_ms=None, max_spans=20000, px=2000)
    out["cold_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    again = G.answer(run, step=None, t0_ms=None, t1_ms=None, max_spans=20000, px=2000)
    out["warm_s"] = time.perf_counter() - t1
    s = first["steps"][len(first["steps"]) // 3]
    t2 = time.perf_counter()
    zoom = G.answer(run, step=None, t0_ms=s["t0_ms"], t1_ms=s["t0_ms"] + 50.0,
                    max_spans=20000, px=2000)
    out["zoom_s"] = time.perf_counter() - t2
    out["json_MB"] = len(json.dumps(again)) / 1e6
    out["segments"] = again["returned"]
    out["zoom_segments"] = zoom["returned"]
    out["steps"] = f"{len(first['steps']):,} of {first['lod']['steps_total']:,}"
    print(json.dumps(out))


def _sizes(a):
    """Per --records size: a fresh folder (removed after) and the steps that give the size."""
    for text in a.records.split(","):
        with tempfile.TemporaryDirectory(dir=a.tmp) as d:
            yield Path(d), max(2, round(parse_count(text) / (a.ranks * PER_STEP)))


def browser(a) -> int:
    """--browser: first paint in Chromium, cold and warm, per size (module doc)."""
    import statistics

    import httpx
    from playwright.sync_api import sync_playwright

    from bench.gantt_render import start_server
    from devtools.browser import launch_chromium
    print("| records | cold first paint s | warm first paint s (median of 3) | segments | "
          "page |")
    print("|---|---|---|---|---|")
    for tmp, steps in _sizes(a):
        proc, url, token = start_server(tmp)
        try:
            auth = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=url, timeout=120) as c:
                rid = c.post("/api/runs", json={
                    "preset": "ddp", "name": "paint bench",
                    "runtime": {"queue": "bench-nobody"}}).json()["id"]
                c.post(f"/api/internal/runs/{rid}/claim", json={"worker": "bench"},
                       headers=auth)
                run = tmp / "var" / "runs" / rid
                run.mkdir(parents=True, exist_ok=True)
                n = make_parquet(run, a.ranks, steps)
                c.post(f"/api/internal/runs/{rid}/finish", headers=auth,
                       json={"status": "succeeded", "exit_code": 0, "summary": {}})
            with sync_playwright() as pw:
                b = launch_chromium(pw)
                page = b.new_page(viewport={"width": 1280, "height": 800})
                times = []
                for _ in range(4):
                    t = time.perf_counter()
                    page.goto(f"{url}/runs/{rid}", wait_until="commit")
                    page.wait_for_selector("#gantt[data-ready='1']", timeout=180_000)
                    times.append(time.perf_counter() - t)
                seg = page.locator("#gantt").get_attribute("data-segments")
                info = (page.locator("#gantt-info").text_content() or "").strip()[:60]
                b.close()
            print(f"| {n:,} | {times[0]:.2f} | {statistics.median(times[1:]):.2f} | "
                  f"{seg} | {info} |", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--records", default="5M")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--browser", action="store_true", help="time the page in Chromium")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.child)
        return 0
    if a.browser:
        return browser(a)
    print("| records | cold first paint s | warm s | 50 ms zoom s | answer MB | segments | "
          "steps listed |")
    print("|---|---|---|---|---|---|---|")
    for d, steps in _sizes(a):
        n = make_parquet(d, a.ranks, steps)
        p = subprocess.run([sys.executable, __file__, "--child", str(d)], check=True,
                           capture_output=True, text=True)
        m = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"| {n:,} | {m['cold_s']:.2f} | {m['warm_s']:.3f} | {m['zoom_s']:.3f} | "
              f"{m['json_MB']:.2f} | {m['segments']:,} | {m['steps']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
