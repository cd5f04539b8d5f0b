"""A user's own script (kind `script`): run unmodified on 2 gloo ranks by torchrun through
jobs/script_runner.py, then analysed by jobs/script_analysis.py (docs/scripts.md).

The scripts in tests/data/scripts/ are written as PyTorch's tutorials write them (DDP, FSDP2
fully_shard, pipelining with ScheduleGPipe); none knows the runner. The oracles are outside the
code under test: the steps the script was told to take, the gradient bytes counted by hand from
the model's shapes, and a single-process replay of the same training (torch's own modules,
gradients averaged by hand) for the losses.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
import torch

import paralab
from jobs.script_analysis import analyse_script_run
from jobs.script_runner import LogTee, profiler_schedule
from jobs.spec import SpecError, parse_spec
from tests.support.launch import ROOT, torchrun

SCRIPTS = ROOT / "tests" / "data" / "scripts"
WORLD = 2


def launch(out: Path, entry: str, args: list[str], **script) -> tuple:
    spec = {"name": entry, "kind": "script", "runtime": {"nproc_per_node": WORLD},
            "script": {"entry": entry, "args": args, **script}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec))
    proc = torchrun(WORLD, ["-m", "jobs.script_runner", "--spec", str(out / "spec.json"),
                            "--out", str(out), "--workdir", str(SCRIPTS)], timeout=300)
    return proc, spec


def ok_run(tmp_path_factory, name: str, entry: str, args: list[str], **script) -> tuple:
    out = tmp_path_factory.mktemp(name)
    proc, spec = launch(out, entry, args, **script)
    assert proc.returncode == 0, (proc.stderr[-3000:], [p.read_text() for p in
                                                        out.glob("error-rank*.txt")])
    headline = analyse_script_run(out, spec)
    doc = json.loads((out / "analysis.json").read_text())
    assert headline == doc["headline"]
    return out, json.loads((out / "script-summary.json").read_text()), doc


def step_rank_steps(doc: dict) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in doc["tables"]["step_rank"]:
        out.setdefault(r["rank"], []).append(r["step"])
    return {k: sorted(v) for k, v in out.items()}


def curve(doc: dict) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in doc["tables"]["throughput"] if r["loss"] is not None}


def steps_taken(out: Path) -> list[int]:
    return [json.loads((out / f"script-rank{r}.json").read_text())["optimizer_steps"]
            for r in range(WORLD)]


# --- DDP ------------------------------------------------------------------------------------

DDP_STEPS = 4


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    return ok_run(tmp_path_factory, "ddp", "ddp_linear.py", ["--steps", str(DDP_STEPS)],
                  tokens_per_step=40, log_regex=r"step (?P<step>\d+) loss (?P<printed>\S+)")


def ddp_replay() -> tuple[list[float], int]:
    """The DDP run in one process: the script's model and batches, each rank's gradient
    computed on its own, averaged by hand (what DDP's all-reduce does), SGD lr 0.1. Returns
    the mean over ranks of the loss each rank logs per step, and the parameter count."""
    ns = runpy.run_path(str(SCRIPTS / "ddp_linear.py"), run_name="replay")
    torch.manual_seed(0)
    model = ns["ToyModel"]()
    params = list(model.parameters())
    losses = []
    for step in range(DDP_STEPS):
        grads, step_losses = [], []
        for rank in range(WORLD):
            x, y = ns["batch"](rank, step)
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            grads.append([p.grad.clone() for p in params])
            step_losses.append(loss.item())
        with torch.no_grad():
            for i, p in enumerate(params):
                p -= 0.1 * (grads[0][i] + grads[1][i]) / WORLD
        losses.append(sum(step_losses) / WORLD)
    return losses, sum(p.numel() for p in params)


@pytest.mark.slow
def test_ddp_steps_are_the_optimizer_steps(ddp):
    out, summary, doc = ddp
    assert steps_taken(out) == [DDP_STEPS] * WORLD
    assert step_rank_steps(doc) == {r: list(range(DDP_STEPS)) for r in range(WORLD)}


@pytest.mark.slow
def test_ddp_allreduce_bytes_are_the_gradient_bytes(ddp):
    out, _, _ = ddp
    # by hand: net1 10x10 + 10, net2 10x5 + 5 float32 parameters, one gradient each
    grad_bytes = (10 * 10 + 10 + 10 * 5 + 5) * 4
    assert grad_bytes == ddp_replay()[1] * 4
    for rank in range(WORLD):
        per_step: dict[int, int] = {}
        for line in (out / f"trace-rank{rank}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec["type"] == "comm" and rec["op"] == "all_reduce":
                per_step[rec["step"]] = per_step.get(rec["step"], 0) + rec["payload_bytes"]
        assert per_step == {s: grad_bytes for s in range(DDP_STEPS)}, (rank, per_step)


@pytest.mark.slow
def test_ddp_loss_curve_is_what_the_script_logged(ddp):
    out, summary, doc = ddp
    want, _ = ddp_replay()
    got = curve(doc)
    assert sorted(got) == list(range(DDP_STEPS))
    assert [got[s] for s in range(DDP_STEPS)] == pytest.approx(want, rel=1e-5)
    assert summary["loss"] == pytest.approx(want, rel=1e-5)
    # log_regex: rank 0's printed loss (6 decimals) read from its output, beside paralab.log's
    logged = [json.loads(x) for x in (out / "metrics-rank0.jsonl").read_text().splitlines()]
    printed = {x["step"]: x["metrics"]["printed"] for x in logged if "printed" in x["metrics"]}
    exact = {x["step"]: x["metrics"]["loss"] for x in logged if "loss" in x["metrics"]}
    assert sorted(printed) == list(range(DDP_STEPS))
    assert all(abs(printed[s] - exact[s]) <= 5e-7 for s in printed), (printed, exact)
    for row in doc["tables"]["throughput"]:  # tokens from script.tokens_per_step
        assert row["tokens"] == 40
        assert row["tokens_per_s"] == pytest.approx(40 / row["step_s"])


# --- FSDP2 -----------------------------------------------------------------------------------

FSDP_STEPS = 3


@pytest.mark.slow
def test_fsdp2_fully_shard_script(tmp_path_factory):
    out, summary, doc = ok_run(tmp_path_factory, "fsdp", "fsdp2_mlp.py",
                               ["--steps", str(FSDP_STEPS)])
    assert steps_taken(out) == [FSDP_STEPS] * WORLD
    assert step_rank_steps(doc) == {r: list(range(FSDP_STEPS)) for r in range(WORLD)}
    # replay: the same model and per-rank batches, gradients averaged, torch's Adam
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gens = [torch.Generator().manual_seed(1 + r) for r in range(WORLD)]
    want = []
    for _ in range(FSDP_STEPS):
        grads, losses = [], []
        for g in gens:
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            losses.append(loss.item())
        for i, p in enumerate(model.parameters()):
            p.grad = sum(gr[i] for gr in grads) / WORLD
        opt.step()
        want.append(sum(losses) / WORLD)
    got = curve(doc)
    assert [got[s] for s in range(FSDP_STEPS)] == pytest.approx(want, rel=1e-4)
    ops = {json.loads(line)["op"] for line in (out / "trace-rank0.jsonl").read_text()
           .splitlines() if '"type":"comm"' in line}
    # parameters all-gathered; gradients reduce-scattered (gloo has no reduce_scatter:
    # FSDP2 reduces them with an all-reduce there)
    assert "all_gather" in ops and ops & {"reduce_scatter", "all_reduce"}, ops


# --- pipelining --------------------------------------------------------------------------------

PP_STEPS = 3


@pytest.mark.slow
def test_pipeline_gpipe_script(tmp_path_factory):
    out, summary, doc = ok_run(tmp_path_factory, "pp", "pipeline_gpipe.py",
                               ["--steps", str(PP_STEPS)])
    assert steps_taken(out) == [PP_STEPS] * WORLD
    assert step_rank_steps(doc) == {r: list(range(PP_STEPS)) for r in range(WORLD)}
    logged = [json.loads(line) for line in (out / "metrics-rank1.jsonl").read_text()
              .splitlines()]
    assert not (out / "metrics-rank0.jsonl").exists()  # only the last stage has a loss
    got = curve(doc)
    assert [got[s] for s in range(PP_STEPS)] == [m["metrics"]["loss"] for m in logged]
    # step 0's loss before any update, in one process: GPipe's mean over 4 equal
    # micro-batches of the MSE is the whole batch's MSE
    ns = runpy.run_path(str(SCRIPTS / "pipeline_gpipe.py"), run_name="replay")
    full = torch.nn.Sequential(ns["stage_module"](0), ns["stage_module"](1))
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    assert got[0] == pytest.approx(torch.nn.functional.mse_loss(full(x), t).item(), rel=1e-5)
    sends = {json.loads(line)["op"] for line in (out / "trace-rank0.jsonl").read_text()
             .splitlines() if '"type":"comm"' in line}
    assert sends & {"send", "isend", "batch_isend_irecv", "send_recv"}, sends


# --- failure ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_failing_script_leaves_error_files_and_a_nonzero_exit(tmp_path):
    proc, spec = launch(tmp_path, "ddp_linear.py", ["--steps", "5", "--fail-at", "1"])
    assert proc.returncode != 0
    for rank in range(WORLD):
        text = (tmp_path / f"error-rank{rank}.txt").read_text()
        assert text.startswith(f"rank {rank}: RuntimeError: deliberate failure after step 1")
        status = json.loads((tmp_path / f"script-rank{rank}.json").read_text())
        assert status["optimizer_steps"] == 2 and status["status"] == "error: RuntimeError"
    # the profiler was stopped and its window written: the two steps taken are analysable
    analyse_script_run(tmp_path, spec)
    doc = json.loads((tmp_path / "analysis.json").read_text())
    summary = json.loads((tmp_path / "script-summary.json").read_text())
    assert step_rank_steps(doc) == {r: [0, 1] for r in range(WORLD)}
    assert summary["loss_steps"] == [0, 1]


# --- no launch ---------------------------------------------------------------------------------

def test_log_is_a_no_op_outside_paralab(tmp_path, monkeypatch):
    monkeypatch.delenv(paralab.METRICS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    paralab.log(0, loss=1.0)
    assert list(tmp_path.iterdir()) == []


def test_log_appends_one_json_line_per_call(tmp_path, monkeypatch):
    path = tmp_path / "metrics-rank0.jsonl"
    monkeypatch.setenv(paralab.METRICS_ENV, str(path))
    paralab.log(0, loss=torch.tensor(2.5), tokens=8)
    paralab.log(1, loss=float("nan"))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["step"], x["metrics"]) for x in lines] == [(0, {"loss": 2.5, "tokens": 8}),
                                                          (1, {"loss": None})]
    assert all(isinstance(x["ts_ns"], int) for x in lines)
    with pytest.raises(TypeError):
        paralab.log(2, loss="low")


@pytest.mark.parametrize("script,loc", [
    ({"entry": "/etc/x.py"}, "script.entry"), ({"entry": "a/../b.py"}, "script.entry"),
    ({"entry": "train.sh"}, "script.entry"), ({"entry": "-m os; rm"}, "script.entry"),
    ({}, "script.entry"), ({"entry": "t.py", "args": "--lr 1"}, "script.args"),
    ({"entry": "t.py", "args": ["a\x00"]}, "script.args"),
    ({"entry": "t.py", "args": ["x"] * 257}, "script.args"),
    ({"entry": "t.py", "env": {"LD_PRELOAD": "x"}}, "script.env"),
    ({"entry": "t.py", "env": {"MASTER_PORT": "1"}}, "script.env"),
    ({"entry": "t.py", "env": {"PARALAB_METRICS_FILE": "/x"}}, "script.env"),
    ({"entry": "t.py", "env": {"lower": "1"}}, "script.env"),
    ({"entry": "t.py", "upload": "abc"}, "script.upload"),
    ({"entry": "t.py", "tokens_per_step": -1}, "script.tokens_per_step"),
    ({"entry": "t.py", "log_regex": "loss=("}, "script.log_regex"),
    ({"entry": "t.py", "log_regex": "loss=[0-9]+"}, "script.log_regex"),
    ({"entry": "t.py", "shell": "x"}, "script.shell"),
])
def test_spec_refuses_unsafe_script_fields(script, loc):
    with pytest.raises(SpecError) as e:
        parse_spec({"kind": "script", "script": script})
    assert loc in [".".join(map(str, x["loc"])) for x in e.value.errors], e.value.errors


def test_spec_accepts_a_script_and_labels_it():
    s = parse_spec({"kind": "script", "script": {
        "entry": "-m pkg.train", "args": ["--lr", "0.1"], "env": {"MY_FLAG": "1"},
        "upload": "a" * 64, "tokens_per_step": 1024,
        "log_regex": "loss=(?P<loss>[0-9.eE+-]+)"}, "trace": {"steps": "0-3"}})
    assert s.strategy == "script" and s.tokens_per_step == 1024
    assert s.to_dict()["script"]["args"] == ["--lr", "0.1"]
    with pytest.raises(SpecError, match="script jobs only"):
        parse_spec({"kind": "train", "script": {"entry": "t.py"}, **{
            "runtime": {"nproc_per_node": 1}}})


@pytest.mark.parametrize("trace,want", [
    ({}, {"wait": 0, "warmup": 0, "active": 20, "repeat": 1}),
    ({"wait": 1, "warmup": 1, "active": 2, "repeat": 3},
     {"wait": 1, "warmup": 1, "active": 2, "repeat": 3}),
    ({"steps": "3-4,7"}, {"wait": 3, "warmup": 0, "active": 5, "repeat": 1}),
    ({"steps": "all"}, None),
])
def test_profiler_schedule_from_the_trace_section(trace, want):
    spec = parse_spec({"kind": "script", "script": {"entry": "t.py"}, "trace": trace})
    assert profiler_schedule(spec.trace) == want


def test_runner_sets_the_variable_paralab_reads():
    from jobs import script_runner
    assert script_runner.METRICS_ENV == paralab.METRICS_ENV


def test_log_regex_reads_rank0_output_into_metrics(tmp_path):
    import io
    shown, path, done = io.StringIO(), tmp_path / "metrics-rank0.jsonl", [0]
    tee = LogTee(shown, r"step (?P<step>\d+) loss=(?P<loss>[0-9.eE+-]+)|lr=(?P<lr>\S+)",
                 path, lambda: done[0])
    print("step 3 loss=0.25 ok", file=tee)
    done[0] = 5
    tee.write("no match\nlr=0.")
    tee.write("5\nlr=bad\n")
    assert shown.getvalue() == "step 3 loss=0.25 ok\nno match\nlr=0.5\nlr=bad\n"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["step"], x["metrics"]) for x in lines] == [(3, {"loss": 0.25}), (4, {"lr": 0.5})]
