"""The Kineto (PyTorch profiler) export of a run, read back by paralab's Kineto reader, whose
figures equal HTA 0.5.0's (tests/kineto/): HTA's idle / compute / non-compute time per rank
must be what paralab's own analysis says of the run.

Oracle: the step_rank table of paralab's analysis of a real 2-rank DDP run (gloo, CPU),
computed from the traces by jobs/analysis/steps.py, not by the export; the export is read
back by jobs/kineto (records.load_ranks + breakdown), which applies HTA's own rules (it drops
the last ProfilerStep, rounds float µs stamps to whole µs).
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path

import pytest

from devtools.oracle import analyze_run_dir
from devtools.oracle.steps import step_row
from jobs.analysis import kineto_download as KD
from jobs.analysis.storage.convert import convert_run_dir
from jobs.analysis.storage.load import from_records, load_run_dir
from jobs.kineto import breakdown as B
from jobs.kineto.records import COMMUNICATION, COMPUTATION, load_ranks
from tests.analysis.synth import comm, meta, span
from tests.support.launch import run_job

STEPS = 4
DDP = {"preset": "ddp", "name": "kineto-export", "train": {"steps": STEPS}}
# HTA rounds each kernel's float-µs start up and end down to whole µs (RULES['ns_rounding']),
# so a figure may move by under 2 µs per kernel of the rank; plus float noise.
ROUND_US_PER_KERNEL = 2.0


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    """A real 2-rank DDP run of 4 steps, converted to Parquet as the worker does."""
    out = run_job(tmp_path_factory.mktemp("kineto_ddp"), DDP, 2, timeout=240)
    convert_run_dir(out)
    return out


@pytest.fixture(scope="module")
def exported(ddp_run, tmp_path_factory) -> Path:
    """The run's zip, unpacked: rank{R}.pt.trace.json per rank."""
    data = b"".join(KD.iter_run_zip(KD.open_run(ddp_run)))
    zf = zipfile.ZipFile(io.BytesIO(data))
    assert zf.testzip() is None and sorted(zf.namelist()) == ["rank0.pt.trace.json",
                                                              "rank1.pt.trace.json"]
    out = tmp_path_factory.mktemp("kineto_out")
    zf.extractall(out)
    return out


def test_htas_breakdown_is_paralabs_analysis(ddp_run, exported):
    ranks = load_ranks(sorted(exported.glob("*.pt.trace.json")))
    kernels = B.hta_kernels(ranks)  # HTA's rows: the last ProfilerStep dropped
    rows = analyze_run_dir(ddp_run)["tables"]["step_rank"]
    tr = load_run_dir(ddp_run)
    kept_steps = range(STEPS - 1)
    for rank in (0, 1):
        ks = kernels[rank]
        tol = ROUND_US_PER_KERNEL * len(ks) + 1e-3
        mine = [r for r in rows if r["rank"] == rank and r["step"] in kept_steps]
        assert len(mine) == STEPS - 1 and all(r["bubble_s"] is None for r in mine)
        got = B.temporal_breakdown(ks)
        compute = 1e6 * sum(r["compute_s"] for r in mine)
        exposed = 1e6 * sum(r["exposed_comm_s"] for r in mine)
        assert got["compute_time_us"] == pytest.approx(compute, abs=tol)
        assert got["non_compute_time_us"] == pytest.approx(exposed, abs=tol)
        # HTA's idle runs from the first kernel to the last: paralab's idle inside the step
        # windows plus the time between the steps' kernels outside those windows
        recs = [r for r in tr.ranks[rank] if r.get("type") in ("span", "comm")
                and r.get("step") in kept_steps and r.get("cat") not in ("step", "comm_wait")
                and not (r["type"] == "span" and r.get("cat") == "comm")]
        extent = (max(r["ts_ns"] + r["dur_ns"] for r in recs)
                  - min(r["ts_ns"] for r in recs)) / 1e3
        idle = 1e6 * sum(r["idle_s"] for r in mine) + extent - 1e6 * sum(r["step_s"]
                                                                         for r in mine)
        assert got["idle_time_us"] == pytest.approx(idle, abs=tol)
        assert got["kernel_time_us"] == pytest.approx(extent, abs=2.0)
        overlap = sum(r["overlap_s"] for r in mine) / sum(r["comm_s"] for r in mine)
        assert B.overlap_pct(ks) == pytest.approx(100 * overlap, abs=100 * tol / 1e6 /
                                                  sum(r["comm_s"] for r in mine) + 0.5)
        assert {k["kernel_type"] for k in ks} == {COMPUTATION, COMMUNICATION}


def test_documents_carry_what_hta_and_tensorboard_read(ddp_run, exported):
    tr = load_run_dir(ddp_run)
    for rank in (0, 1):
        text = (exported / f"rank{rank}.pt.trace.json").read_text()
        doc = json.loads(text)
        # HTA 0.5.0 (hta/common/trace_file.py) takes a file's rank from the first match of
        # this regex, line by line; without a match every file is rank 0
        assert re.search(r'"rank":\s+(\d+)', text).group(1) == str(rank)
        info = doc["distributedInfo"]
        assert info["backend"] == "gloo" and info["rank"] == rank and info["world_size"] == 2
        assert info["pg_count"] == len(info["pg_config"]) == 2
        for pg in info["pg_config"]:
            assert set(pg) == {"pg_name", "pg_desc", "backend_config", "pg_size", "ranks"}
            assert pg["ranks"] == [0, 1] and pg["pg_size"] == 2
        assert isinstance(doc["schemaVersion"], int) and doc["deviceProperties"] == []
        assert doc["baseTimeNanoseconds"] == min(m["t0_ns"] for m in tr.meta.values())
        evs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        assert all(isinstance(e["ts"], int | float) and e["dur"] >= 0 for e in evs)
        steps = sorted(e["name"] for e in evs if e["cat"] == "user_annotation")
        assert steps == [f"ProfilerStep#{s}" for s in range(STEPS)]
        kern = [e for e in evs if e["cat"] == "kernel"]
        launches = {e["args"]["correlation"] for e in evs if e["cat"] == "cuda_runtime"}
        assert {k["args"]["correlation"] for k in kern} == launches
        comp = [k for k in kern if not k["name"].startswith("ncclDevKernel_")]
        nccl = [k for k in kern if k["name"].startswith("ncclDevKernel_")]
        # the trace's records in µs from the origin: a compute kernel per forward, backward
        # and optimizer span, a comm kernel per comm record, the comm ones on their own stream
        raw = tr.ranks[rank]
        t0 = doc["baseTimeNanoseconds"]
        want = sorted(round((r["ts_ns"] - t0) / 1e3, 3) for r in raw if r.get("type") == "span"
                      and r.get("name") in ("forward", "backward", "optimizer"))
        assert sorted(k["ts"] for k in comp) == want
        comms = [r for r in raw if r.get("type") == "comm"]
        assert len(nccl) == len(comms) >= STEPS
        assert {k["args"]["stream"] for k in comp}.isdisjoint({k["args"]["stream"]
                                                                for k in nccl})
        gloo = {e["args"]["External id"]: e for e in evs if e["name"] == "gloo:all_reduce"}
        assert len(gloo) == len(comms)
        for k, r in zip(sorted(nccl, key=lambda k: k["ts"]), comms, strict=True):
            assert k["name"] == "ncclDevKernel_AllReduce_gloo"
            op = gloo[k["args"]["External id"]]  # torch's gloo span, issue to completion
            assert (op["cat"], op["ts"], op["dur"]) == ("cpu_op", k["ts"], k["dur"])
            assert k["dur"] == pytest.approx(r["dur_ns"] / 1e3, abs=2e-3)
            a = k["args"]
            assert a["Collective name"] == "allreduce" and a["dtype"] == "Float"
            assert a["In msg nelems"] == a["Out msg nelems"] == r["payload_bytes"] // 4
            assert a["Group size"] == 2 and json.loads(a["Process Group Ranks"]) == [0, 1]
            assert a["device"] == 0 and isinstance(a["stream"], int)
        # paralab's Kineto reader sees one collective per comm record, with its sizes
        coll = load_ranks([exported / f"rank{rank}.pt.trace.json"])[rank].collectives
        assert [(c["collective"], c["in_nelems"], c["group_ranks"]) for c in coll] == [
            ("allreduce", r["payload_bytes"] // 4, [0, 1]) for r in comms]


def test_blocking_comm_is_cut_out_of_compute():
    """A synchronous all-reduce inside forward (no bucket, no async): the host waited, so
    the compute kernel is split around it, as step_rank's compute_s subtracts it."""
    recs = [meta(0, 1), span(0, 0, "step", 0, 100, cat="step"), span(0, 0, "forward", 10, 60),
            comm(0, 0, "all_reduce", 30, 40, n=1, payload=64), span(0, 0, "backward", 60, 90),
            span(0, 1, "step", 100, 200, cat="step"), span(0, 1, "forward", 110, 150)]
    tr = from_records({0: recs})
    docs = "".join(KD.iter_rank(KD.open_run(traces=tr), 0))
    kern = [e for e in json.loads(docs)["traceEvents"] if e.get("cat") == "kernel"]
    fwd = sorted((k["ts"], k["ts"] + k["dur"]) for k in kern if k["name"] == "forward")
    t0 = tr.t0_ns() / 1e3
    assert [(a + t0, b + t0) for a, b in fwd] == [(10, 30), (40, 60), (110, 150)]
    row = step_row(0, 0, {}, [r for r in tr.ranks[0] if r.get("step") == 0])
    step0 = [k for k in kern if k["ts"] + t0 < 100]
    comp_us = sum(k["dur"] for k in step0 if not k["name"].startswith("nccl"))
    assert comp_us == pytest.approx(row["compute_s"] * 1e6)


@pytest.mark.filterwarnings("ignore")  # HTA warns on pandas 3 idioms
def test_hta_itself_reads_the_export(exported):
    """HTA's own TraceAnalysis on the unpacked zip: the reader's figures (skipped without
    HTA, as tests/kineto/test_hta_live.py; the reader equals HTA on 4 public trace sets)."""
    pytest.importorskip("hta", reason="holistictraceanalysis (HTA) is not installed: not in "
                        "the CI install; `pip install holistictraceanalysis==0.5.0` to run it")
    import logging

    from hta.trace_analysis import TraceAnalysis
    logging.disable(logging.WARNING)  # HTA logs every parse step as a warning
    ta = TraceAnalysis(trace_dir=str(exported))
    ours = B.analyse(load_ranks(sorted(exported.glob("*.pt.trace.json"))))
    tb = ta.get_temporal_breakdown(visualize=False)
    assert sorted(int(r) for r in tb["rank"]) == [0, 1]
    for row in tb.to_dict("records"):
        want = ours["temporal"][int(row["rank"])]
        for col, key in (("kernel_time(us)", "kernel_time_us"), ("idle_time(us)", "idle_time_us"),
                         ("compute_time(us)", "compute_time_us"),
                         ("non_compute_time(us)", "non_compute_time_us")):
            assert float(row[col]) == pytest.approx(want[key], abs=1e-6), (row, col)
    ov = ta.get_comm_comp_overlap(visualize=False)
    for row in ov.to_dict("records"):
        assert float(row["comp_comm_overlap_pctg"]) == pytest.approx(
            ours["overlap_pct"][int(row["rank"])], abs=0.01)


@pytest.mark.filterwarnings("ignore")
def test_tensorboard_plugin_reads_the_export(ddp_run, exported, tmp_path):
    """The TensorBoard profiler plugin's own parser: 4 steps, kernels, and the distributed
    view's gloo all-reduces sized as the trace's payload (skipped without the plugin)."""
    pytest.importorskip("torch_tb_profiler", reason="torch-tb-profiler (TensorBoard's "
                        "profiler plugin) is not installed: not in the CI install; `pip "
                        "install torch-tb-profiler==0.4.3 pandas` to run it")
    pytest.importorskip("pandas", reason="torch-tb-profiler needs pandas, not installed")
    from torch_tb_profiler.profiler.data import DistributedRunProfileData, RunProfileData
    from torch_tb_profiler.profiler.loader import RunLoader
    tr = load_run_dir(ddp_run)
    profiles = []
    for rank in (0, 1):
        data = RunProfileData.parse(f"rank{rank}", None,
                                    str(exported / f"rank{rank}.pt.trace.json"), str(tmp_path))
        profiles.append(DistributedRunProfileData(data))
        assert data.has_kernel and data.has_communication
        assert data.steps_names == [str(s) for s in range(STEPS)]
    loader = RunLoader.__new__(RunLoader)  # only its cross-rank step, no worker processes
    loader.run_name = "kineto-export"
    dist = loader._process_distributed_profiles(profiles, None)
    for rank in (0, 1):
        (row,) = dist.comm_ops["data"][f"rank{rank}"]["rows"]
        comms = [r for r in tr.ranks[rank] if r.get("type") == "comm"]
        assert row[:3] == ["gloo:all_reduce", len(comms), sum(r["payload_bytes"] for r in comms)]
