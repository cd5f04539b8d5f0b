"""The run lifecycle end to end on real components: the backend and a Celery worker as
subprocesses, real Redis, real PostgreSQL, real torchrun with 2 gloo ranks.

Process checks scan /proc for PARALAB_RUN_ID, which finds ranks even after they are
re-parented to PID 1 (they are not in torchrun's process group)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.torchrun import MODULE as TORCHRUN
from jobs.units import fmt
from tests.conftest import (
    FINISHED,
    children_of,
    pids_with_run_id,
    redis_service_body,
    wait_for,
)
from worker.hang import rank_pids
from worker.procs import proc_key

pytestmark = pytest.mark.slow

LONG = {"preset": "ddp", "name": "long", "train": {"steps": 1_000_000}}


@pytest.fixture(scope="module")
def _shared_service(tmp_path_factory, pg_server_url):
    """One backend + worker (real Redis, real PostgreSQL) for the module: starting them costs
    seconds per test, and every test here works on its own runs."""
    yield from redis_service_body(tmp_path_factory.mktemp("lifecycle"), pg_server_url)


@pytest.fixture
def redis_service(_shared_service):
    """The shared service with both processes up (a test may stop, kill or restart either),
    and, after the test, none of its runs left unfinished to hold the worker's one slot."""
    svc = _shared_service
    if svc.backend is None or svc.backend.poll() is not None:
        svc.start_backend()
    if svc.worker is None or svc.worker.poll() is not None:
        svc.start_worker()
    yield svc
    if svc.backend.poll() is not None:
        svc.start_backend()
    for r in svc.http.get("/api/runs", params={"status": "queued,running"}).json()["items"]:
        svc.http.post(f"/api/runs/{r['id']}/cancel")
        svc.wait_status(r["id"], (*FINISHED, "hung"), 60)


def wait_ranks_running(svc, run_id, n=2):
    """Every process carrying the run's ID, once its n ranks are up (as the worker's hang watch
    finds them: the shim, torchrun and its fork server carry the ID too)."""
    svc.wait_status(run_id, "running", 60)
    wait_for(lambda: len(rank_pids(proc_key(run_id))) >= n, 60, f"{n} ranks of run {run_id}")
    return pids_with_run_id(run_id)


def assert_no_process_left(run_id, within=5.0):
    """No process carries the run's ID any more, at the latest `within` seconds from now."""
    deadline = time.monotonic() + within
    while (left := pids_with_run_id(run_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"processes of run {run_id} still alive after {within:g} s: {left}"


def republish(svc, run_id: str) -> None:
    """Publish the run's task again through the service's own broker settings: the same task id
    (`run-<id>`) the backend used, i.e. what a broker redelivery looks like to a worker."""
    code = ("import sys; from backend.core.config import get_settings; "
            "from worker.app import enqueue_run; "
            "enqueue_run(get_settings(), sys.argv[1], sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, run_id, svc.queue], env=svc.env, check=True,
                   cwd=svc.tmp, timeout=60)


def test_a_task_delivered_twice_launches_its_run_once(redis_service):
    """The same message delivered twice while the run is queued (a redelivery racing the first
    delivery): exactly one launch; the second delivery is refused at claim."""
    svc = redis_service
    svc.stop(svc.worker)  # both deliveries wait in the queue
    run = svc.submit({"preset": "ddp", "train": {"steps": 2}})
    republish(svc, run["id"])
    svc.start_worker()
    done = svc.wait_status(run["id"], ("succeeded", "failed"), 120)
    assert done["status"] == "succeeded", done["error"]
    wait_for(lambda: f"run {run['id']} not launched: run is succeeded, not queued" in
             (svc.tmp / "worker.log").read_text(errors="replace")
             or f"run {run['id']} not launched: run is running, not queued" in
             (svc.tmp / "worker.log").read_text(errors="replace"), 60,
             "the worker to refuse the second delivery")
    log = svc.http.get(f"/api/runs/{run['id']}/logs").text
    assert log.count("[paralab] launching") == 1, log


def test_ddp_run_succeeds_with_logs_traces_and_provenance(redis_service):
    svc = redis_service
    run = svc.submit({"preset": "ddp", "name": "e2e", "train": {"steps": 3},
                      "tags": ["e2e"]})
    assert run["status"] == "queued"
    done = svc.wait_status(run["id"], ("succeeded", "failed"), 120)
    assert done["status"] == "succeeded", done["error"]
    assert done["exit_code"] == 0 and done["started_at"] and done["finished_at"]
    assert len(done["summary"]["loss"]) == 3
    prov = done["provenance"]
    assert prov["torch"].startswith("2.13") and prov["python"] and prov["host"]
    assert prov["paralab_commit"] and prov["device"]
    files = {f["path"] for f in svc.http.get(f"/api/runs/{run['id']}/files").json()}
    assert {"trace-rank0.jsonl", "trace-rank1.jsonl", "summary.json", "spec.json"} <= files
    # the worker's columnar conversion ran (a failure there only logs and falls back), from
    # the flusher's blocks (jobs/trace_blocks.py: the twin of the lines of a rank that
    # closed its tracer), and left no side file of its own, nor the blocks
    assert {"trace-rank0.parquet", "trace-rank1.parquet"} <= files
    assert not [f for f in files if f.endswith((".rows", ".part", ".blocks", ".live"))], files
    import io

    import pyarrow.parquet as pq
    for r in (0, 1):
        pf = svc.http.get(f"/api/runs/{run['id']}/files/trace-rank{r}.parquet").content
        assert pq.read_schema(io.BytesIO(pf)).metadata[b"paralab.origin"] == b"blocks"
    trace = svc.http.get(f"/api/runs/{run['id']}/files/trace-rank1.jsonl").text
    assert trace.strip() and all(line.startswith("{") for line in trace.strip().splitlines())
    log = svc.http.get(f"/api/runs/{run['id']}/logs").text
    assert "[paralab] launching" in log and "finished: succeeded" in log
    assert svc.http.get(f"/api/runs/{run['id']}/logs", params={"rank": 0}).text
    health = svc.http.get("/api/health").json()
    assert health["ok"] and health["checks"]["broker"]["ok"] and health["checks"]["workers"][
        "count"] >= 1
    workers = [w for w in svc.http.get("/api/workers").json() if w["queue"] == svc.queue]
    assert workers[0]["slots"] == 1 and workers[0]["devices"][0]["memory_bytes"] > 0


def test_cancel_stops_every_process(redis_service):
    svc = redis_service
    run = svc.submit(LONG)
    pids = wait_ranks_running(svc, run["id"])
    argvs = {p: Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0") for p in pids}
    torchrun = next(p for p, a in argvs.items() if a[1:3] == [b"-m", TORCHRUN.encode()])
    shim = next(p for p, a in argvs.items() if a[1:3] == [b"-m", b"worker.shim"])
    assert children_of(shim) == [torchrun]
    ranks = rank_pids(proc_key(run["id"]))
    assert len(ranks) >= 2 and set(ranks) <= set(pids), (ranks, pids)  # every rank carries it
    assert svc.http.post(f"/api/runs/{run['id']}/cancel").status_code == 200
    # the bound is wait_status's deadline (a status not reached in 10 s raises), not a clock
    # read here: a slow POST on a loaded machine must not fail a cancel that worked
    done = svc.wait_status(run["id"], ("cancelled", "failed", "succeeded"), 10)
    assert done["status"] == "cancelled"
    assert_no_process_left(run["id"])


def test_a_long_run_is_converted_while_it_runs(redis_service):
    """The worker's live thread (jobs/analysis/storage/convert_live.py) writes row groups to
    `trace-rank{R}.parquet.live` while the job runs; after the cancel the rest is appended,
    and the run has its Parquet traces and analysis, no live file uploaded. The live
    analysis (analyze_live.py) fed its passes too, and the columnar engine goes on from them:
    the only table files uploaded are the ones the analysis names (tables too large for
    analysis.json, kept whole)."""
    import io

    import pyarrow.parquet as pq
    svc = redis_service
    # every step traced (the default schedule would take minutes to fill a row group)
    run = svc.submit({**LONG, "trace": {"steps": "all"}})
    svc.wait_status(run["id"], "running", 60)
    # a row group holds 64 Ki rows: a few hundred steps of the DDP preset
    wait_for(lambda: list(svc.tmp.glob(f"var/**/{run['id']}/**/trace-rank0.parquet.live")),
             240, "a live row group of rank 0")
    assert svc.http.post(f"/api/runs/{run['id']}/cancel").status_code == 200
    done = svc.wait_status(run["id"], ("cancelled", "failed", "succeeded"), 60)
    assert done["status"] == "cancelled"
    # the whole log (GET /logs is its first page: a run cancelled past ~5,000 steps has more
    # lines than one page, and its last ones, the notes, would never be on it)
    log = wait_for(lambda: "converted while the job ran" in (
        t := svc.http.get(f"/api/runs/{run['id']}/logs/download").text) and t, 120,
        "the live note")
    assert "traces in Parquet" in log, log[-3000:]
    # a cancel is reported before the analysis and the upload (tasks._report): wait for them
    files = wait_for(lambda: {"trace-rank0.parquet", "trace-rank1.parquet", "analysis.json"}
                     <= (fs := {f["path"] for f in svc.http.get(
                         f"/api/runs/{run['id']}/files").json()}) and fs, 120, "the upload")
    assert not [f for f in files if f.endswith((".live", ".blocks", ".part"))], files
    analysis = svc.http.get(f"/api/runs/{run['id']}/files/analysis.json").json()
    assert analysis["engine"] == "columnar"
    assert {f for f in files if f.startswith("table-")} == {
        t["file"] for t in (analysis.get("table_files") or {}).values()}, files
    pf = pq.ParquetFile(io.BytesIO(svc.http.get(
        f"/api/runs/{run['id']}/files/trace-rank0.parquet").content))
    assert pf.metadata.num_row_groups >= 2 and pf.metadata.row_group(0).num_rows == 1 << 16
    assert pf.schema_arrow.metadata[b"paralab.origin"] == b"blocks"


def test_timeout_is_enforced(redis_service):
    svc = redis_service
    run = svc.submit({**LONG, "runtime": {"timeout_s": 6}})
    # On a loaded machine torchrun may still be starting its ranks when the 6 s run out: the
    # timeout must stop whatever is there, so wait for the ranks or the end, whichever is first
    svc.wait_status(run["id"], ("running", "timed_out", "failed", "succeeded"), 60)
    wait_for(lambda: len(rank_pids(proc_key(run["id"]))) >= 2
             or svc.run(run["id"])["status"] != "running", 60, "the ranks or the timeout")
    done = svc.wait_status(run["id"], ("timed_out", "failed", "succeeded"), 60)
    assert done["status"] == "timed_out" and "timed out after 6 s" in done["error"]
    assert_no_process_left(run["id"])


def test_a_rank_that_raises_fails_the_run_with_its_error(redis_service):
    svc = redis_service
    # nccl on a host without CUDA: every rank raises inside init_process_group.
    run = svc.submit({"preset": "ddp", "train": {"steps": 2}, "runtime": {"backend": "nccl"}})
    done = svc.wait_status(run["id"], ("failed", "succeeded"), 120)
    assert done["status"] == "failed" and done["exit_code"] != 0
    assert "rank " in done["error"] and "Error" in done["error"], done["error"]
    files = {f["path"] for f in svc.http.get(f"/api/runs/{run['id']}/files").json()}
    assert any(p.startswith("error-rank") for p in files)
    assert_no_process_left(run["id"], within=1)


def test_worker_killed_outright(redis_service):
    """kill -9 of the worker: the job dies with it (parent-death signal) and the run does not
    stay running: the backend fails it as `worker lost` once heartbeats stop."""
    svc = redis_service
    run = svc.submit(LONG)
    wait_ranks_running(svc, run["id"])
    os.kill(svc.worker.pid, signal.SIGKILL)
    svc.worker.wait()
    # torchrun gets SIGTERM from the kernel (parent-death signal) and stops its ranks; it
    # escalates to SIGKILL on its own after its 30 s grace, so that is the bound here.
    assert_no_process_left(run["id"], within=40)
    done = svc.wait_status(run["id"], ("failed", "succeeded", "cancelled"), 60)
    assert done["status"] == "failed" and "worker lost" in done["error"], done
    # The broker redelivers the unacknowledged message only after its visibility timeout
    # (hours), so deliver it again now: the same Celery task id and run id, as a redelivery
    # carries. The restarted worker takes it, is refused at claim, and launches nothing.
    svc.start_worker()
    republish(svc, run["id"])
    wait_for(lambda: f"run {run['id']} not launched: run is failed, not queued" in
             (svc.tmp / "worker.log").read_text(errors="replace"), 60,
             "the worker to refuse the redelivered task")
    after = svc.run(run["id"])
    assert after["status"] == "failed" and after["started_at"] == done["started_at"]
    assert after["error"] == done["error"] and pids_with_run_id(run["id"]) == []


def test_backend_restarted_while_a_run_is_going(redis_service):
    svc = redis_service
    run = svc.submit({"preset": "ddp", "train": {"steps": 1500}})
    wait_ranks_running(svc, run["id"])
    svc.stop(svc.backend)
    time.sleep(3)  # heartbeats and log batches fail meanwhile; the worker keeps them
    svc.start_backend()
    done = svc.wait_status(run["id"], ("succeeded", "failed"), 180)
    assert done["status"] == "succeeded", done["error"]
    assert len(done["summary"]["loss"]) == 1500
    log = svc.http.get(f"/api/runs/{run['id']}/logs/download").text  # every page
    assert "finished: succeeded" in log


def test_cli_submit_wait_runs_show_logs_cancel(redis_service, tmp_path):
    svc = redis_service
    env = {**svc.env, "PARALAB_URL": svc.url}

    def cli(*args, stdin=None):
        return subprocess.run([sys.executable, "-m", "backend.cli", *args], env=env,
                              capture_output=True, text=True, input=stdin, timeout=300)

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "from the cli", "train": {"steps": 2},
                                "runtime": {"queue": svc.queue}}))
    r = cli("submit", str(spec), "--preset", "ddp", "--wait", "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["status"] == "succeeded" and run["name"] == "from the cli"
    listed = json.loads(cli("runs", "--json", "--strategy", "ddp").stdout)
    assert run["id"] in [x["id"] for x in listed["items"]]
    table = cli("runs").stdout.splitlines()
    assert table[0].split()[:3] == ["ID", "NAME", "STRATEGY"] and any(
        run["id"] in line for line in table[1:])
    shown = cli("show", run["id"]).stdout
    assert "succeeded" in shown and f"{svc.url}/runs/{run['id']}" in shown
    full = svc.run(run["id"])
    # the run's figures, in the one formatter's words (jobs.units)
    assert f"step time: {fmt(full['step_time_s'], 's')}" in shown
    assert f"peak memory: {fmt(full['peak_memory_bytes'], 'B')}" in shown
    assert "[paralab] launching" in cli("logs", run["id"]).stdout
    assert "finished: succeeded" in cli("logs", run["id"], "-f").stdout  # ends with the run
    bad = cli("submit", "-", stdin=json.dumps({"preset": "ddp", "parallel": {"dp": 3}}))
    assert bad.returncode == 2 and "parallel: dp*tp*pp" in bad.stderr
    assert cli("submit", "-", stdin="{not json").returncode == 2
    again = cli("cancel", run["id"])
    assert again.returncode == 2 and "already succeeded" in again.stderr
    out = cli("predict", "--preset", "zero3")
    assert out.returncode == 0 and "per rank" in out.stdout
    assert "0.000 GB" not in out.stdout  # a KB-sized model reads in kB, not as zero GB
    assert " kB" in out.stdout
