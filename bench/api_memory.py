"""API resident memory over many finished runs: flat (within ±10 % of its value after a
warm-up). A finished run is converted (the worker leaves its Parquet files beside the lines):
its page is read from its stored analysis and, a window at a time, from its Parquet files
(backend/services/gantt_columnar.py), and the API parses none of its JSON lines. With
--json-only (a worker lost before converting) the API converts the lines into its scratch
cache, bounded in bytes (backend/services/run_traces.py, Settings.analysis_cache_mb).

    OMP_NUM_THREADS=1 .venv/bin/python bench/api_memory.py [--runs 500] [--records 100000]
    OMP_NUM_THREADS=1 .venv/bin/python bench/api_memory.py --runs 40 --records 20000   (minutes)
    ... --minutes 38: stop at that time bound and report the runs done (a loaded machine)

Starts a real `paralab serve` (devtools/service.py, the harness the tests and bench/lifecycle.py
use) on the embedded default (SQLite + filesystem broker), no worker. One run's trace is
written once (bench/analysis_speed.py's synthetic 4-rank DP x TP record mix, as the tracer's
flusher writes it: lines and blocks), converted, with its stored analysis (jobs.analysis.
write_analysis), as the worker leaves a run. Each run then goes the worker's way through the
API: submitted, claimed on the worker channel, its files hard-linked into its folder (the bytes
are not what is measured; the channel's upload is), finished with a summary (which warms its
page in the API), and then asked what its page asks: the run, the analysis headline, a table,
the Gantt's steps and the Gantt. The API process's RSS (/proc/<pid>/status VmRSS) is sampled
every --every runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.services.run_traces import PARQUET_PER_LINE_BYTE  # noqa: E402
from bench.analysis_speed import PER_STEP, make_run, spec_dict  # noqa: E402
from devtools.service import Service  # noqa: E402 - the harness the tests use
from jobs.analysis import write_analysis  # noqa: E402
from jobs.analysis.storage.convert import convert_run_dir  # noqa: E402

RANKS = 4
TABLE = "step_rank"  # a table the run page pages through
MiB = 1 << 20


def rss(pid: int) -> int:
    """Resident bytes of the process, as the kernel counts them."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def template(folder: Path, records: int, converted: bool = True
             ) -> tuple[Path, int, int, dict]:
    """One run's files, written once: (folder, records, steps, headline). `converted`: its
    Parquet files beside the lines, as the worker leaves every finished run (False: the
    lines only, as a run whose worker was lost before converting)."""
    steps = max(1, round(records / (RANKS * PER_STEP)))
    folder.mkdir()
    n = make_run(folder, RANKS, steps)
    if converted:
        convert_run_dir(folder)
    headline = write_analysis(folder, spec_dict(RANKS, steps))
    assert "analysis_error" not in headline, headline
    return folder, n, steps, headline


def start(d: Path, env: dict, tries: int = 3) -> Service:
    """A `paralab serve` on the embedded default; again on another port when the free port
    it was given was taken meanwhile (other suites start services on this machine)."""
    for i in range(tries):
        tmp = d / f"svc{i}"
        tmp.mkdir()
        svc = Service(tmp, db_url=f"sqlite:///{tmp}/paralab.db", redis_url=None, extra_env=env)
        try:
            svc.start_backend()
            if svc.backend.poll() is None:
                return svc
        except AssertionError:  # devtools.service.wait_for: it never answered
            if i == tries - 1:
                raise
        svc.close()
        print(f"the API did not start (port {svc.port} taken?): trying again", flush=True)
    raise RuntimeError("the API did not start")


def new_run(svc: Service, worker: dict, src: Path, steps: int, headline: dict, i: int) -> str:
    """A finished run the worker's way: submit, claim, its files in place, finish."""
    body = {"preset": "ddp", "name": f"mem-{i}", "model": {"arch": "gpt"},
            "parallel": {"dp": RANKS // 2, "tp": 2}, "runtime": {"nproc_per_node": RANKS},
            "train": {"steps": steps, "global_batch": RANKS}, "trace": {"steps": "all"}}
    run_id = svc.submit(body)["id"]
    r = svc.http.post(f"/api/internal/runs/{run_id}/claim", headers=worker,
                      json={"worker": "bench", "task_id": f"t{i}"})
    assert r.status_code == 200 and r.json()["launch"], r.text
    dest = svc.tmp / "var" / "runs" / run_id  # Settings.runs_dir under the service's data dir
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        os.link(f, dest / f.name)
    r = svc.http.post(f"/api/internal/runs/{run_id}/finish", headers=worker,
                      json={"status": "succeeded", "exit_code": 0,
                            "summary": {"headline": headline}})
    assert r.status_code == 200, r.text
    return run_id


def browse(svc: Service, run_id: str) -> None:
    """What a user opening the finished run's page asks for."""
    for path in ("", "/metrics", f"/metrics?table={TABLE}&limit=50", "/gantt/steps", "/gantt"):
        r = svc.http.get(f"/api/runs/{run_id}{path}", timeout=300)
        assert r.status_code == 200, (path, r.status_code, r.text[:500])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--records", type=int, default=100_000, help="records per run (all ranks)")
    ap.add_argument("--every", type=int, default=10, help="sample RSS after every k runs")
    ap.add_argument("--warmup", type=int, default=None,
                    help="runs before the reference sample (default: a tenth, 5 to 20, and "
                    "at least until the cache is full)")
    ap.add_argument("--minutes", type=float, default=None,
                    help="stop after this long and report the runs done (a loaded machine)")
    ap.add_argument("--cache-mb", type=float, default=None,
                    help="PARALAB_ANALYSIS_CACHE_MB for the API (default: the setting's)")
    ap.add_argument("--json-only", action="store_true",
                    help="runs without their Parquet files (a worker lost before converting): "
                    "the API parses their JSON lines into its byte-bounded cache")
    ap.add_argument("--no-trim", action="store_true",
                    help="PARALAB_HEAP_TRIM=0: the API keeps what glibc frees (to measure)")
    a = ap.parse_args(argv)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="api-memory-") as d:
        t0 = time.perf_counter()
        src, n, steps, headline = template(Path(d) / "template", a.records, not a.json_only)
        size = sum(f.stat().st_size for f in src.glob("trace-rank*.jsonl"))
        kind = "JSON lines only" if a.json_only else "converted, as the worker leaves it"
        print(f"template: {n} records ({RANKS} ranks x {steps} steps, {kind}), traces "
              f"{size / MiB:.1f} MiB, written in {time.perf_counter() - t0:.1f} s", flush=True)
        env = {} if a.cache_mb is None else {"PARALAB_ANALYSIS_CACHE_MB": str(a.cache_mb)}
        if a.no_trim:
            env["PARALAB_HEAP_TRIM"] = "0"
        svc = start(Path(d), env)
        try:
            pid = svc.backend.pid
            worker = {"Authorization": f"Bearer {svc.env['PARALAB_WORKER_TOKEN']}",
                      "X-Paralab-Worker": "bench"}
            limit = svc.http.get("/api/health").json()["checks"]["memory"][
                "trace_cache_limit_bytes"]
            # runs after which the cache evicts (--json-only; the charge's estimate)
            full = int(limit // (PARQUET_PER_LINE_BYTE * size)) + 1
            warmup = a.warmup or min(a.runs // 2, max(full + 2, min(20, max(5, a.runs // 10))))
            if not 0 < warmup < a.runs:
                ap.error("--warmup must be between 1 and --runs - 1")
            print(f"API pid {pid}: RSS at start {rss(pid) / MiB:.0f} MiB; cache bound "
                  f"{limit / MiB:.0f} MiB (full after {full} runs); warm-up {warmup} runs",
                  flush=True)
            samples: list[tuple[int, int]] = []
            t1 = time.perf_counter()
            stop = t1 + 60 * a.minutes if a.minutes else float("inf")
            for i in range(1, a.runs + 1):
                browse(svc, new_run(svc, worker, src, steps, headline, i))
                late = time.perf_counter() > stop and i > warmup
                if i % a.every == 0 or i == warmup or i == a.runs or late:
                    samples.append((i, rss(pid)))
                    print(f"  after {i:4d} runs: RSS {samples[-1][1] / MiB:7.1f} MiB "
                          f"({time.perf_counter() - t1:.0f} s)", flush=True)
                if late:
                    print(f"stopped after {i} of {a.runs} runs (--minutes {a.minutes:g})")
                    break
            mem = svc.http.get("/api/health").json()["checks"]["memory"]
        finally:
            svc.close()
    load1 = os.getloadavg()
    ref = next(b for i, b in samples if i == warmup)
    after = [b for i, b in samples if i >= warmup]
    spread = max(abs(b - ref) for b in after) / ref
    print(f"runs {samples[-1][0]} x {n} records; RSS after warm-up ({warmup} runs) "
          f"{ref / MiB:.1f} MiB, "
          f"max {max(after) / MiB:.1f} MiB, last {after[-1] / MiB:.1f} MiB, "
          f"spread ±{100 * spread:.1f} % of the warm-up value")
    # the samples land anywhere between "one run's parse cached" and "the next one's parse
    # alive too": also the range about its middle, and the growth (late half vs early half)
    lo, hi, half = min(after), max(after), len(after) // 2
    early, late_half = after[:max(1, half)], after[max(1, half):] or after[-1:]
    print(f"range {lo / MiB:.1f}-{hi / MiB:.1f} MiB: ±{100 * (hi - lo) / (hi + lo):.1f} % about "
          f"its middle; mean of the later half vs the earlier: "
          f"{100 * (sum(late_half) / len(late_half) / (sum(early) / len(early)) - 1):+.1f} %")
    print(f"health: rss_bytes {mem['rss_bytes'] / MiB:.1f} MiB, trace cache "
          f"{mem['trace_cache_bytes'] / MiB:.1f} of {mem['trace_cache_limit_bytes'] / MiB:.0f} "
          f"MiB charged")
    print(f"load average (1, 5, 15 min): start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
          f"end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    met = spread <= 0.10
    print(f"goal (flat within ±10 %): {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
