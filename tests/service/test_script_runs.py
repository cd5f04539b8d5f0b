"""A user's own training script through the whole service (issue 41): `paralab submit
--script ddp_linear.py --workdir DIR -- --steps 4` packs the folder (.gitignore honoured),
uploads it, submits a run of kind `script`; the embedded worker fetches and unpacks it, runs it
unmodified under torchrun with the profiler, and the run's analysis has every optimizer step,
the DDP all-reduce bytes per step equal to the gradient bytes (hand count), and the loss curve
the script logged with paralab.log. Refusals name the field: an entry not in the upload, a
file entry without an upload."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from backend import cli
from tests.conftest import embedded_service
from tests.support.archives import tgz

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"
pytestmark = pytest.mark.slow
# ddp_linear.py's ToyModel: Linear(10, 10) + Linear(10, 5), fp32 gradients all-reduced
GRAD_BYTES = 4 * (10 * 10 + 10 + 10 * 5 + 5)


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from embedded_service(tmp_path_factory.mktemp("scripts"))


def run_cli(monkeypatch, capsys, svc, *argv):
    monkeypatch.setenv("PARALAB_URL", svc.url)
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_ddp_script_runs_unmodified_and_is_analysed(svc, monkeypatch, capsys, tmp_path):
    work = tmp_path / "project"
    work.mkdir()
    shutil.copy(SCRIPTS / "ddp_linear.py", work / "ddp_linear.py")
    (work / ".gitignore").write_text("checkpoints/\n")
    (work / "checkpoints").mkdir()
    (work / "checkpoints" / "big.pt").write_bytes(b"\0" * 1000)
    extra = tmp_path / "spec.json"  # the queue the fixture's worker serves
    extra.write_text(json.dumps({"name": "my ddp", "runtime": {"queue": svc.queue}}))
    code, out, err = run_cli(monkeypatch, capsys, svc, "submit", str(extra), "--script",
                             "ddp_linear.py", "--workdir", str(work), "--nproc", "2",
                             "--wait", "--json", "--", "--steps", "4")
    assert code == 0, (out, err, svc.logs())
    run = json.loads(out[out.index("{"):])
    assert (run["kind"], run["status"], run["strategy"]) == ("script", "succeeded", "script")
    # the upload holds what git would see: the ignored folder stayed home
    up = svc.http.get(f"/api/uploads/{run['spec']['script']['upload']}").json()
    assert sorted(up["entries"]) == [".gitignore", "ddp_linear.py"]
    a = svc.http.get(f"/api/runs/{run['id']}/metrics").json()
    steps = sorted({r["step"] for r in a["tables"]["step_rank"]})
    assert steps == [0, 1, 2, 3]
    for s in steps:  # DDP reduces every gradient once per step: the bytes of all gradients
        got = sum(c["payload_bytes"] for c in a["tables"]["collectives"]
                  if c["step"] == s and c["op"] == "all_reduce")
        assert got == GRAD_BYTES, (s, got)
    logged = [r["loss"] for r in a["tables"]["throughput"]]
    assert len(logged) == 4 and all(v is not None for v in logged)
    # who ran what: the submission's audit entry names the code by its hash and entry
    audit = svc.http.get("/api/audit", params={"action": "run.submit"}).json()
    mine = next(e for e in audit if e["target"] == run["id"])
    assert mine["detail"]["script"] == {"upload": up["sha256"], "entry": "ddp_linear.py"}


def test_refusals_name_the_field(svc):
    up = svc.http.post("/api/uploads", files={"file": ("w.tar.gz", tgz({"a.py": b"x=1"}))})
    assert up.status_code in (200, 201), up.text
    sha = up.json()["sha256"]
    base = {"kind": "script", "parallel": {"dp": 2}, "runtime": {"queue": svc.queue}}
    r = svc.http.post("/api/runs", json={**base, "script": {"entry": "train.py",
                                                           "upload": sha}})
    assert r.status_code == 422, r.text
    d = r.json()["detail"][0]
    assert d["loc"] == ["body", "script", "entry"] and "train.py is not a file" in d["msg"]
    assert "a.py" in d["msg"]
    r = svc.http.post("/api/runs", json={**base, "script": {"entry": "a.py"}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "script",
                                                                      "upload"]
    r = svc.http.post("/api/runs", json={**base, "script": {"entry": "a.py",
                                                           "upload": "0" * 64}})
    assert r.status_code == 422 and "no upload" in r.json()["detail"][0]["msg"]


def test_a_hung_script_ends_hung_with_the_usual_diagnosis(svc, tmp_path):
    """tests/data/scripts/hang_skip.py: rank 1 skips an explicit all_reduce at step 2. The
    worker's hang watch reads the runner's flight files (jobs/script_flight.py), stops the
    run as `hung`, and the stored diagnosis names rank 1; no process of the run is left."""
    import time

    from tests.conftest import pids_with_run_id
    work = tmp_path / "hang"
    work.mkdir()
    shutil.copy(SCRIPTS / "hang_skip.py", work / "hang_skip.py")
    up = svc.http.post("/api/uploads", files={"file": ("w.tar.gz", tgz(
        {"hang_skip.py": (work / "hang_skip.py").read_bytes()}))}).json()
    run = svc.submit({"kind": "script", "name": "hung script", "parallel": {"dp": 2},
                      "runtime": {"queue": svc.queue, "hang_timeout_s": 15, "timeout_s": 300},
                      "script": {"entry": "hang_skip.py", "upload": up["sha256"],
                                 "args": ["--steps", "4", "--skip-at", "2"]}})
    done = svc.wait_status(run["id"], ("succeeded", "failed", "hung", "timed_out"), 240)
    for _ in range(120):  # the summary (with the diagnosis) follows the first report
        if done["summary"] is not None:
            break
        time.sleep(0.5)
        done = svc.run(run["id"])
    assert done["status"] == "hung", done["error"]
    d = (done["summary"] or {}).get("diagnosis")
    assert d and d["waited_for"] == 1, d
    assert d["sentence"].startswith("rank 1 never entered all_reduce #2 of group world"), d
    deadline = time.monotonic() + 10
    while (left := pids_with_run_id(run["id"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], left


def _submit_script(svc, name: str, files: dict[str, bytes], entry: str, args: list[str],
                   **runtime) -> dict:
    up = svc.http.post("/api/uploads", files={"file": ("w.tar.gz", tgz(files))})
    assert up.status_code in (200, 201), up.text
    return svc.submit({"kind": "script", "name": name, "parallel": {"dp": 2},
                       "runtime": {"queue": svc.queue, **runtime},
                       "script": {"entry": entry, "upload": up.json()["sha256"],
                                  "args": args}})


@pytest.mark.parametrize("script, steps", [("fsdp2_mlp.py", 3), ("pipeline_gpipe.py", 3)])
def test_fsdp2_and_pipelining_scripts_run_through_the_service(svc, script, steps):
    """torch's own FSDP2 (`fully_shard`) and `torch.distributed.pipelining` (GPipe) in the style
    of its tutorials, unmodified: each run succeeds with every optimizer step analysed, the
    collectives its strategy issues, and the loss curve it logged."""
    run = _submit_script(svc, script, {script: (SCRIPTS / script).read_bytes()}, script,
                         ["--steps", str(steps)])
    done = svc.wait_status(run["id"], ("succeeded", "failed", "hung", "timed_out"), 240)
    assert done["status"] == "succeeded", (done["error"], svc.logs()[-3000:])
    a = svc.http.get(f"/api/runs/{run['id']}/metrics").json()
    assert sorted({r["step"] for r in a["tables"]["step_rank"]}) == list(range(steps))
    ops = {c["op"] for c in a["tables"]["collectives"]}
    # FSDP2 gathers its shards (and, on gloo, reduces gradients with all-reduce);
    # pipelining sends activations and gradients between the two stages
    # (the profiler names gloo's point-to-point of batch_isend_irecv send_recv)
    assert ({"all_gather"} <= ops) if script.startswith("fsdp2") else ("send_recv" in ops), ops
    losses = [r["loss"] for r in a["tables"]["throughput"]]
    assert len(losses) == steps and all(v is not None for v in losses)


def test_cancelling_a_script_run_leaves_no_process(svc):
    import time

    from tests.conftest import pids_with_run_id, wait_for
    run = _submit_script(svc, "long", {"hang_skip.py": (SCRIPTS / "hang_skip.py").read_bytes()},
                         "hang_skip.py", ["--steps", "100000"], hang_timeout_s=0)
    wait_for(lambda: len(pids_with_run_id(run["id"])) >= 2, 120, "its ranks")
    c = svc.http.post(f"/api/runs/{run['id']}/cancel")
    assert c.status_code == 200, c.text
    done = svc.wait_status(run["id"], ("cancelled",), 120)
    assert done["status"] == "cancelled"
    deadline = time.monotonic() + 15
    while (left := pids_with_run_id(run["id"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], left
