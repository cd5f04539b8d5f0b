"""POST /api/advise bounded (issue 36, item 1): what one search costs at the largest requests
the default settings allow and beyond them, and what four searches at once do to the history
page (`GET /api/runs`), beside the same with no search running.

    OMP_NUM_THREADS=1 .venv/bin/python bench/advise_bound.py [--seconds 20] [--root DIR]

A real `paralab serve` on loopback (the tests' Service harness; SQLite; no worker; 40 queued
runs for the history page), restarted for each request so that each search gets fresh
processes. The rate limits are raised out of the way (PARALAB_RATE_LIMIT_*); every other
setting is its default. Requests (the seed-004 GPT, 8 devices per host):

  largest cluster    1024 x 8 at global batch 512 (the largest cluster a request may name)
  costliest allowed  128 x 8 at batch 999,424: the most candidates (9,795) any hosts x 8
                     request of this model gets within the defaults
  beyond: candidates 256 x 8 at batch 999,424 (11,151 candidates > 10,000)
  beyond: 840 x 12   the issue's cluster with a model with divisors everywhere (layers 720):
                     more than 200,000 layouts

Printed per request: status, the API process's CPU seconds and peak RSS (VmHWM), the search
processes' (children of the API running jobs.theory.pool) CPU seconds and peak RSS. Then
`GET /api/runs` p50 / p99 from HISTORY clients for --seconds with no search, and with four
clients posting the costliest allowed request back to back (a 503 "busy": retried after 0.5 s;
its count is printed). `--root DIR` runs the backend of another checkout (e.g. `git archive
HEAD | tar -x -C DIR`) to compare with the code before the bounds: give it --skip-beyond, as
the requests beyond the bounds run there for minutes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.service import Service  # noqa: E402 - the harness the tests use

TICK = os.sysconf("SC_CLK_TCK")
HISTORY = 2
GPT3B = {"arch": "gpt", "layers": 32, "hidden": 2560, "heads": 32, "seq_len": 2048,
         "vocab": 50304}
WIDE = {"arch": "gpt", "layers": 720, "hidden": 55440, "heads": 720, "seq_len": 40320,
        "vocab": 50304}
CLUSTER = {"devices_per_host": 8, "device_memory_bytes": 80e9, "intra_GBps": 300,
           "inter_GBps": 25, "flops": 300e12}


def body(model, batch, hosts, per=8):
    return {"model": model, "global_batch": batch, "top": 20,
            "cluster": {**CLUSTER, "hosts": hosts, "devices_per_host": per}}


REQUESTS = {
    "largest cluster 1024x8 b512": body(GPT3B, 512, 1024),
    "costliest allowed 128x8 b999424": body(GPT3B, 999_424, 128),
    "beyond: candidates 256x8 b999424": body(GPT3B, 999_424, 256),
    "beyond: 840x12 layers 720": body(WIDE, 997_920, 840, 12),
}
BEYOND = tuple(k for k in REQUESTS if k.startswith("beyond"))


def proc_stat(pid: int) -> tuple[float, float]:
    """(utime + stime seconds, VmHWM bytes) of a process; (0, 0) once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0, 0.0
    hwm = next((int(line.split()[1]) * 1024 for line in status.splitlines()
                if line.startswith("VmHWM:")), 0)
    return (int(fields[11]) + int(fields[12])) / TICK, float(hwm)


def search_children(api_pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == api_pid and b"jobs.theory.pool" in (p / "cmdline").read_bytes():
                out.append(int(p.name))
        except (OSError, ValueError):
            continue
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def fresh(svc: Service) -> None:
    svc.stop(svc.backend)
    svc.start_backend()


def one_request(svc: Service, name: str) -> None:
    fresh(svc)
    api = svc.backend.pid
    cpu0, _ = proc_stat(api)
    t0 = time.perf_counter()
    r = svc.http.post("/api/advise", json=REQUESTS[name], timeout=600)
    wall = time.perf_counter() - t0
    cpu1, api_hwm = proc_stat(api)
    kids = [proc_stat(pid) for pid in search_children(api)]
    counts = r.json().get("counts", {})
    note = (f"{counts['considered'] - sum(counts['pruned'].values())} candidates"
            if r.status_code == 200 else
            r.json()["detail"][0]["msg"][:60] if r.status_code == 422 else r.text[:60])
    print(f"| {name} | {r.status_code} | {wall:.1f} | {cpu1 - cpu0:.2f} | "
          f"{api_hwm / 2**20:.0f} | {sum(c for c, _ in kids):.2f} | "
          f"{max((h for _, h in kids), default=0) / 2**20:.0f} | {note} |", flush=True)


def history_phase(svc: Service, seconds: float, searches: int) -> None:
    fresh(svc)
    api = svc.backend.pid
    stop = threading.Event()
    lat: list[float] = []
    answers: dict[int, int] = {}

    def history():
        while not stop.is_set():
            t0 = time.perf_counter()
            r = svc.http.get("/api/runs", params={"limit": 50}, timeout=120)
            lat.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            time.sleep(0.1)

    def search():
        while not stop.is_set():
            r = svc.http.post("/api/advise", json=REQUESTS["costliest allowed 128x8 b999424"],
                              timeout=600)
            answers[r.status_code] = answers.get(r.status_code, 0) + 1
            if r.status_code != 200:
                time.sleep(0.5)

    threads = [threading.Thread(target=search) for _ in range(searches)]
    for t in threads:
        t.start()
    time.sleep(2.0 if searches else 0)  # the searches under way first
    cpu0, _ = proc_stat(api)
    hist = [threading.Thread(target=history) for _ in range(HISTORY)]
    for t in hist:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in hist + threads:
        t.join()
    cpu1, api_hwm = proc_stat(api)
    kids = [proc_stat(pid) for pid in search_children(api)]
    print(f"| {searches} | {len(lat)} | {pct(lat, 0.5) * 1000:.0f} | {pct(lat, 0.99) * 1000:.0f}"
          f" | {cpu1 - cpu0:.1f} | {api_hwm / 2**20:.0f} | "
          f"{max((h for _, h in kids), default=0) / 2**20:.0f} | {dict(sorted(answers.items()))}"
          f" |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--root", default=None, help="run this checkout's backend")
    ap.add_argument("--skip-beyond", action="store_true")
    args = ap.parse_args()
    env = {"PARALAB_RATE_LIMIT_ADVISE": "1000000", "PARALAB_RATE_LIMIT_COMPUTE": "1000000"}
    if args.root:
        env["PYTHONPATH"] = str(Path(args.root).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        svc = Service(Path(tmp), db_url=f"sqlite:///{tmp}/p.db", redis_url=None,
                      extra_env=env)
        try:
            svc.start_backend()
            for i in range(40):
                svc.submit({"preset": "ddp", "name": f"history {i}"})
            print(f"backend: {args.root or 'this checkout'}; {time.strftime('%Y-%m-%d %H:%M')}")
            print("| request | status | wall s | API CPU s | API peak RSS MiB | search CPU s | "
                  "search peak RSS MiB | answer |\n|---|---|---|---|---|---|---|---|")
            for name in REQUESTS:
                if not (args.skip_beyond and name in BEYOND):
                    one_request(svc, name)
            print(f"\nGET /api/runs (limit 50, {HISTORY} clients) for {args.seconds:g} s\n"
                  "| searches at once | requests | p50 ms | p99 ms | API CPU s | "
                  "API peak RSS MiB | search peak RSS MiB | advise answers |\n"
                  "|---|---|---|---|---|---|---|---|")
            for searches in (0, 4):
                history_phase(svc, args.seconds, searches)
        finally:
            svc.close()


if __name__ == "__main__":
    main()
