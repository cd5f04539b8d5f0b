"""Gantt time to interactive (issue 7): a synthetic 8-rank trace with 200,000 spans.

Starts a real `paralab serve` on a fresh SQLite database, creates a run and uploads the
synthetic trace through the worker channel (as a worker would), then opens the run page in
Debian's headless Chromium (Playwright) at 1280x800 and times navigation start -> the Gantt drawn
and its zoom handler bound (`#gantt[data-ready]`, set after Plotly's promise resolves). Cold =
first load (the server parses the trace); warm = a reload (parsed trace cached). Also reports
the /gantt endpoint's server time, response size and segment count, and a zoom round trip
(relayout -> finer level of detail fetched and drawn).

    .venv/bin/python bench/gantt_render.py [--ranks 8] [--spans 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.browser import launch_chromium  # noqa: E402
from devtools.launch import free_port  # noqa: E402
from devtools.service import wait_for  # noqa: E402


def synthetic_trace(rank: int, ranks: int, spans: int, mb: int = 20, buckets: int = 9) -> str:
    """A DDP-like rank: per step `mb` forwards and backwards, `buckets` async all-reduces, an
    optimizer span (50 spans a step) plus the step envelope; times in ns from a common origin."""
    per_step = 2 * mb + buckets + 1
    steps = spans // ranks // per_step
    spec = {"parallel": {"dp": ranks, "tp": 1, "pp": 1, "microbatches": mb}}
    lines = [{"type": "meta", "schema": 1, "rank": rank, "world_size": ranks,
              "coords": {"pp": 0, "dp": rank, "tp": 0}, "spec": spec, "step": -1}]
    t = 1_000_000_000 + rank * 3_000
    for s in range(steps):
        start = t
        for m in range(mb):
            d = 200_000 + (rank * 7919 + m * 104729 + s) % 50_000
            lines.append({"type": "span", "name": "forward", "cat": "compute", "rank": rank,
                          "step": s, "microbatch": m, "ts_ns": t, "dur_ns": d})
            t += d + 5_000
        for m in range(mb):
            d = 400_000 + (rank * 31 + m * 7 + s) % 80_000
            lines.append({"type": "span", "name": "backward", "cat": "compute", "rank": rank,
                          "step": s, "microbatch": m, "ts_ns": t, "dur_ns": d})
            if m % (mb // buckets + 1) == 0 and m // (mb // buckets + 1) < buckets:
                lines.append({"type": "comm", "op": "all_reduce", "axis": "dp", "group": "dp",
                              "seq": s * buckets + m, "group_size": ranks, "rank": rank,
                              "payload_bytes": 4 << 20, "bytes_sent": 7 << 20, "step": s,
                              "microbatch": m, "bucket": m, "ts_ns": t + d // 2,
                              "dur_ns": 900_000})
            t += d + 5_000
        while sum(1 for x in lines[-per_step:] if x["type"] == "comm" and x["step"] == s) \
                < buckets:
            lines.append({"type": "comm", "op": "all_reduce", "axis": "dp", "group": "dp",
                          "seq": 0, "group_size": ranks, "rank": rank, "payload_bytes": 1 << 20,
                          "bytes_sent": 1 << 20, "step": s, "microbatch": None, "ts_ns": t,
                          "dur_ns": 300_000})
            t += 310_000
        lines.append({"type": "span", "name": "optimizer", "cat": "compute", "rank": rank,
                      "step": s, "microbatch": None, "ts_ns": t, "dur_ns": 300_000})
        t += 320_000
        lines.append({"type": "span", "name": "step", "cat": "step", "rank": rank, "step": s,
                      "microbatch": None, "ts_ns": start, "dur_ns": t - start})
        t += 20_000
    return "\n".join(json.dumps(x) for x in lines) + "\n"


def start_server(tmp: Path) -> tuple[subprocess.Popen, str, str]:
    port, token = free_port(), secrets.token_urlsafe(24)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALAB_")
           and k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({"PARALAB_DATA_DIR": str(tmp / "var"), "DATABASE_URL": f"sqlite:///{tmp}/b.db",
                "PARALAB_PORT": str(port), "PARALAB_WORKER_TOKEN": token})
    subprocess.run([sys.executable, "-m", "backend.cli", "migrate"], env=env, check=True,
                   cwd=tmp, stdout=subprocess.DEVNULL)
    proc = subprocess.Popen([sys.executable, "-m", "backend.cli", "serve"], env=env, cwd=tmp,
                            stdout=open(tmp / "serve.log", "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def live():
        try:
            return httpx.get(url + "/api/health/live", timeout=2).status_code == 200
        except httpx.TransportError:
            return False
    wait_for(live, 60, "the backend")
    return proc, url, token


def upload_run(url: str, token: str, ranks: int, spans: int) -> tuple[str, int]:
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=120) as c:
        rid = c.post("/api/runs", json={"preset": "ddp", "name": "gantt bench",
                                        "runtime": {"queue": "bench-nobody"}}).json()["id"]
        c.post(f"/api/internal/runs/{rid}/claim", json={"worker": "bench"}, headers=auth)
        total = 0
        for r in range(ranks):
            body = synthetic_trace(r, ranks, spans).encode()
            total += sum(1 for line in body.splitlines()
                         if b'"type": "comm"' in line or (b'"type": "span"' in line
                                                          and b'"cat": "step"' not in line))
            c.put(f"/api/internal/runs/{rid}/files/trace-rank{r}.jsonl", content=body,
                  headers=auth)
        c.post(f"/api/internal/runs/{rid}/finish", headers=auth,
               json={"status": "succeeded", "exit_code": 0, "summary": {}})
    return rid, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        proc, url, token = start_server(tmp)
        try:
            rid, total = upload_run(url, token, args.ranks, args.spans)
            size = sum(p.stat().st_size for p in (tmp / "var" / "runs" / rid).glob("*.jsonl"))
            print(f"trace: {args.ranks} ranks, {total:,} spans, {size / 1e6:.1f} MB", flush=True)
            with sync_playwright() as pw:
                browser = launch_chromium(pw)
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                tti = []
                for i in range(args.repeat + 1):
                    t = time.perf_counter()
                    page.goto(f"{url}/runs/{rid}", wait_until="commit")
                    page.wait_for_selector("#gantt[data-ready='1']", timeout=180_000)
                    tti.append(time.perf_counter() - t)
                    nav = page.evaluate("() => performance.now()") / 1e3
                    print(f"load {i} ({'cold' if i == 0 else 'warm'}): {tti[-1]:.2f} s "
                          f"(page clock {nav:.2f} s); "
                          f"{page.locator('#gantt-info').text_content()}", flush=True)
                seg = page.locator("#gantt").get_attribute("data-segments")
                # zoom: a relayout to 1/50 of the run asks the server for a finer window
                t = time.perf_counter()
                page.evaluate("""() => { const g = document.getElementById('gantt');
                    const [a, b] = g.layout.xaxis.range; g.dataset.ready = '0';
                    Plotly.relayout(g, {'xaxis.range': [a, a + (b - a) / 50]}); }""")
                page.wait_for_selector("#gantt[data-ready='1']", timeout=60_000)
                zoom = time.perf_counter() - t
                zseg = page.locator("#gantt").get_attribute("data-segments")
                browser.close()
            with httpx.Client(base_url=url, timeout=120) as c:
                server = []
                for _ in range(5):
                    t = time.perf_counter()
                    r = c.get(f"/api/runs/{rid}/gantt")
                    server.append(time.perf_counter() - t)
                body = r.json()
            print(f"\ncold load (server parses the trace): {tti[0]:.2f} s")
            print(f"warm load, median of {args.repeat}: {statistics.median(tti[1:]):.2f} s "
                  f"(min {min(tti[1:]):.2f}, max {max(tti[1:]):.2f})")
            print(f"segments drawn: {seg} of {total:,} spans; zoom to 1/50: {zoom:.2f} s, "
                  f"{zseg} segments")
            print(f"GET /gantt (warm): median {statistics.median(server) * 1e3:.0f} ms, "
                  f"{len(r.content) / 1e6:.2f} MB, {body['returned']:,} segments, "
                  f"{len(body['idle']['t0']):,} idle gaps, lod bucket "
                  f"{body['lod']['bucket_ms']:.3f} ms; load average {os.getloadavg()[0]:.1f}")
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
