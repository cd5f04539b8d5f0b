"""The dashboard's Gantt (backend/services/gantt.py) without a browser: level of detail keeps it
bounded and accounts for every span; its simulated schedule is the analysis' own; the run's
endpoints answer from the trace files while no stored analysis exists."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from backend.core.config import Settings
from backend.main import create_app
from backend.migrate import upgrade
from backend.services import gantt, gantt_columnar, run_traces
from jobs.analysis import load_run_dir
from jobs.spec import parse_spec


def write_trace(folder, ranks=4, steps=50, mb=8, pp=False, actions=False):
    """DDP-like (or pipeline-like) ranks: per step mb forwards + backwards, one all-reduce (or
    a send), an optimizer span and the step envelope; `actions`: named F / BW with their
    pipeline action, micro-batch and stage (as the pipeline runtime writes them)."""
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    for r in range(ranks):
        spec = parse_spec({"parallel": {"dp": 1 if pp else ranks, "pp": ranks if pp else 1,
                                        "microbatches": mb, "pp_schedule": "1f1b"},
                           "model": {"layers": ranks * 2},
                           "train": {"global_batch": ranks * mb},
                           "runtime": {"nproc_per_node": ranks}},
                          max_world_size=64).to_dict()
        coords = {"pp": r if pp else 0, "dp": 0 if pp else r, "tp": 0}
        recs = [{"type": "meta", "rank": r, "coords": coords, "spec": spec, "step": -1}]
        t = 10**12 + r * 1000
        for s in range(steps):
            start = t
            for m in range(mb):
                for name, d in (("forward", 100_000), ("backward", 200_000)):
                    act = {"F": "F", "forward": "F"}.get(name, "BW")
                    extra = {"name": act, "action": act, "chunk": 0, "stage": r} if actions else {}
                    recs.append({"type": "span", "name": name, "cat": "compute", "rank": r,
                                 "step": s, "microbatch": m, "ts_ns": t, "dur_ns": d, **extra})
                    t += d + 1000
            recs.append({"type": "comm", "op": "send" if pp else "all_reduce",
                         "axis": "pp" if pp else "dp", "group": "g", "seq": s, "rank": r,
                         "group_size": ranks, "payload_bytes": 1 << 20, "bytes_sent": 1 << 20,
                         "step": s, "ts_ns": t - 150_000, "dur_ns": 300_000})
            recs.append({"type": "span", "name": "optimizer", "cat": "compute", "rank": r,
                         "step": s, "ts_ns": t + 200_000, "dur_ns": 50_000})
            t += 300_000
            recs.append({"type": "span", "name": "step", "cat": "step", "rank": r, "step": s,
                         "ts_ns": start, "dur_ns": t - start})
            recs.append({"type": "mem", "rank": r, "step": s, "ts_ns": t, "params": 1000,
                         "grads": 1000, "optimizer": 2000, "activations": 500 + r})
            t += 10_000
            total += 2 * mb + 2
        text = "\n".join(json.dumps(x) for x in recs) + "\n"
        (folder / f"trace-rank{r}.jsonl").write_text(text + '{"type": "span", "na')  # torn
    return total


def test_level_of_detail_bounds_the_answer_and_counts_every_span(tmp_path):
    total = write_trace(tmp_path, ranks=8, steps=100, mb=12)
    trace = gantt.columns(load_run_dir(tmp_path))
    full = gantt.gantt(trace, max_spans=total)
    assert full["total_spans"] == full["returned"] == total and not full["lod"]["merged"]
    small = gantt.gantt(trace, max_spans=500)
    assert small["total_spans"] == total and small["returned"] <= 500
    assert small["lod"]["merged"] and sum(small["segments"]["n"]) == total
    assert [r["rank"] for r in small["rows"]] == list(range(8))
    # zooming into a window returns that window exactly once it fits the budget
    w = small["window"]
    zoom = gantt.gantt(trace, t0_ms=w["t0_ms"], t1_ms=w["t0_ms"] + 5, max_spans=500)
    assert 0 < zoom["total_spans"] == zoom["returned"] <= 500
    assert min(zoom["segments"]["t1"]) >= w["t0_ms"]


def answer(folder, step=None):
    """GET /gantt's answer for a running run's folder: its scratch conversion's window."""
    src = run_traces.source(folder)
    assert src != folder and run_traces.source(folder) == src  # a copy, kept per version
    return gantt_columnar.answer(src, step=step, t0_ms=None, t1_ms=None, max_spans=20000,
                                 px=2000)


def test_pipeline_step_draws_the_analysis_simulation(tmp_path):
    write_trace(tmp_path, ranks=4, steps=3, mb=4, pp=True, actions=True)
    g = answer(tmp_path, step=1)
    assert g["theory"]["p"] == 4 and len(g["theory"]["rows"]) == 4
    assert len(g["theory"]["rows"][0]["spans"]) == 8  # 4 F + 4 BW per pipeline rank (1f1b)
    assert {r["label"] for r in g["rows"]} == {f"rank {r} (pp{r})" for r in range(4)}
    a, where = run_traces.analysis(tmp_path, None)
    assert a["partial"] is True and where == run_traces.source(tmp_path)
    # the timeline header's simulated bubble is the analysis' figure, to the last digit
    assert g["theory"]["bubble_fraction"] == a["headline"]["bubble_simulated_fraction"]
    assert g["theory"]["stage_times_steps"] == a["headline"]["steady_steps"] == [1, 2]
    for row in a["tables"]["step_rank"]:
        parts = row["compute_s"] + row["exposed_comm_s"] + row["bubble_s"] + row["idle_s"]
        assert parts == pytest.approx(row["step_s"], rel=1e-9, abs=1e-12)


def test_zbv_pipeline_theory_follows_the_v(tmp_path):
    write_trace(tmp_path, ranks=2, steps=3, mb=4, pp=True, actions=True)
    for f in tmp_path.glob("trace-rank*.jsonl"):
        f.write_text(f.read_text().replace('"pp_schedule": "1f1b"', '"pp_schedule": "zbv"')
                     .replace('"virtual_stages": 1', '"virtual_stages": 2'))
    th = answer(tmp_path, step=1)["theory"]
    assert (th["schedule"], th["p"], th["v"]) == ("zbv", 2, 2) and len(th["rows"]) == 2
    for row in th["rows"]:
        assert len(row["spans"]) == 2 * 4 * 3  # F, B, W of 4 micro-batches on both chunks
        assert {s["chunk"] for s in row["spans"]} == {0, 1}


@pytest.fixture
def client(tmp_path):
    url = f"sqlite:///{tmp_path}/v.db"
    upgrade(url)
    settings = Settings(data_dir=tmp_path / "var", database_url=url, worker_token="t" * 32)
    with TestClient(create_app(settings)) as c:
        c.settings = settings
        yield c


def test_run_endpoints_answer_from_the_partial_trace(client):
    run = client.post("/api/runs", json={"preset": "ddp", "name": "=cmd|x",
                                         "runtime": {"queue": "nobody"}}).json()
    rid = run["id"]
    assert client.get(f"/api/runs/{rid}/gantt").status_code == 404  # no trace yet
    assert client.get(f"/api/runs/{rid}/metrics").status_code == 404
    write_trace(client.settings.runs_dir / rid, ranks=2, steps=4, mb=2)
    g = client.get(f"/api/runs/{rid}/gantt", params={"max_spans": 100}).json()
    assert g["total_spans"] == 2 * 4 * 6 and len(g["rows"]) == 2
    assert len(client.get(f"/api/runs/{rid}/gantt/steps").json()["steps"]) == 4
    m = client.get(f"/api/runs/{rid}/metrics").json()
    assert m["partial"] is True and len(m["tables"]["step_rank"]) == 8
    assert {x["axis"] for x in m["tables"]["axis_bytes"]} == {"dp"}
    mem = m["tables"]["memory"]
    assert {(r["rank"], r["component"]) for r in mem} >= {(0, "params"), (1, "activations")}
    assert all(r["predicted_bytes"] > 0 for r in mem)  # the ddp preset's theory
    csv = client.get(f"/api/runs/{rid}/export", params={"format": "csv", "table": "memory"})
    assert csv.status_code == 200 and csv.text.startswith("rank,coords,component")
    for gone in ("breakdown", "comm", "memory", "tables/memory.csv"):  # one source of figures
        assert client.get(f"/api/runs/{rid}/{gone}").status_code == 404
    for page in ("/new", "/compare", "/collectives", "/schedules", f"/runs/{rid}"):
        assert client.get(page).status_code == 200
    assert client.get("/static/vendor/plotly.min.js").status_code == 200


def test_lanes_per_rank_and_channel_and_nesting(tmp_path):
    write_trace(tmp_path, ranks=2, steps=2, mb=1)
    for f in tmp_path.glob("trace-rank*.jsonl"):  # a layer span nested in each forward
        lines = f.read_text().splitlines()
        extra = []
        for ln in lines[:-1]:
            r = json.loads(ln)
            if r.get("name") == "forward":
                extra.append(json.dumps({**r, "name": "forward.layer", "ts_ns": r["ts_ns"] + 10,
                                         "dur_ns": r["dur_ns"] // 2}))
        f.write_text("\n".join(lines[:-1] + extra) + "\n")
    g = answer(tmp_path)
    lanes = [(ln["rank"], ln["channel"]) for ln in g["lanes"]]
    assert lanes == [(0, "compute"), (0, "comm dp"), (1, "compute"), (1, "comm dp")]
    assert [ln["label"] for ln in g["lanes"]][:2] == ["rank 0 (dp0)", "  comm dp"]
    ys = [ln["y"] for ln in g["lanes"]]
    assert ys == sorted(ys) and len(set(ys)) == 4
    s = g["segments"]
    keys = g["keys"]
    depth = {(keys[k], d) for k, d in zip(s["key"], s["depth"], strict=True)}
    assert ("forward.layer", 1) in depth and ("forward", 0) in depth and ("all_reduce", 0) in depth
    lane_of = {i: g["lanes"][ln]["channel"] for i, ln in enumerate(s["lane"])}
    assert {lane_of[i] for i, k in enumerate(s["key"]) if keys[k] == "all_reduce"} == {"comm dp"}
