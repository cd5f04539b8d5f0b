"""POST /api/imports end to end in-process (SQLite and PostgreSQL): real profiler traces in, a
run of kind `import` out, analysed by the one engine.

Oracles: what the traced gloo job did (tests/kineto/test_gloo_cpu.py: 3 profiled steps, per
step an all_reduce of 37 float32 and one of the 2-element bias gradient), and HTA 0.5.0's
figures recorded on the public ViT traces (hta_expected.json, written by HTA itself)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.kineto.test_gloo_cpu import ALLREDUCE_N, STEPS, gloo_traces  # noqa: F401 (fixture)

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
HTA = json.loads((Path(__file__).with_name("hta_expected.json")).read_text())["sets"]


def post(client, files: list[tuple[str, bytes]], **form):
    data = {"name": form.pop("name", "imported"), **form}
    return client.post("/api/imports", data=data,
                       files=[("files", (n, b, "application/octet-stream")) for n, b in files])


def read(paths) -> list[tuple[str, bytes]]:
    return [(Path(p).name, Path(p).read_bytes()) for p in paths]


def nothing_stored(client, settings) -> None:
    assert client.get("/api/runs").json()["items"] == []
    runs = settings.runs_dir
    assert not runs.exists() or not any(runs.iterdir())
    staged = settings.data_dir / "imports"
    assert not staged.exists() or not any(staged.iterdir())


def test_a_gloo_job_imports_as_a_run_with_its_steps_and_collectives(client, gloo_traces):  # noqa: F811
    r = post(client, read(gloo_traces), name="gloo job", tags=["cpu", "gloo"], notes="*x*")
    assert r.status_code == 201, r.text
    run = r.json()
    assert (run["kind"], run["status"], run["world_size"], run["strategy"]) == \
        ("import", "succeeded", 2, "import")
    assert sorted(run["tags"]) == ["cpu", "gloo"] and run["name"] == "gloo job"
    assert [x["id"] for x in client.get("/api/runs").json()["items"]] == [run["id"]]
    a = client.get(f"/api/runs/{run['id']}/metrics").json()
    steps = {(x["rank"], x["step"]) for x in a["tables"]["step_rank"]}
    assert steps == {(rank, s) for rank in range(2) for s in range(STEPS)}
    coll = a["tables"]["collectives"]
    # per step two all_reduces, matched across both ranks: 37 float32, then the 2-float bias
    sizes = sorted((c["step"], c["payload_bytes"]) for c in coll)
    assert sizes == sorted((s, b) for s in range(STEPS) for b in (ALLREDUCE_N * 4, 2 * 4))
    assert all(c["op"] == "all_reduce" and c["group_size"] == 2 for c in coll)
    assert a["kineto"]["temporal"] == []  # a CPU trace has no GPU kernels: no HTA figures
    # memory: the profiler's allocator total at its highest, per rank (read here with json)
    peaks = {x["rank"]: x["measured_bytes"] for x in a["tables"]["memory"]
             if x["component"] == "allocator"}
    assert peaks == {rank: _peak_allocated(p) for rank, p in enumerate(gloo_traces)}
    assert a["headline"]["peak_memory_bytes"] == max(peaks.values())
    # the Perfetto export reads the converted traces like a launched run's: every collective
    pf = client.get(f"/api/runs/{run['id']}/export").json()
    names = [e.get("name") for e in pf["traceEvents"]]
    assert names.count("all_reduce") == 2 * 2 * STEPS  # 2 per step, each on both ranks
    # the Kineto export of an import is its own traces, byte for byte
    z = client.get(f"/api/runs/{run['id']}/export", params={"format": "kineto"})
    assert z.status_code == 200, z.text
    with zipfile.ZipFile(io.BytesIO(z.content)) as zf:
        assert {n: zf.read(n) for n in zf.namelist()} == {
            f"rank{r}.pt.trace.json.gz": Path(p).read_bytes() for r, p in enumerate(gloo_traces)}
    one = client.get(f"/api/runs/{run['id']}/export", params={"format": "kineto", "rank": 1})
    assert one.content == Path(gloo_traces[1]).read_bytes()
    files = {f["path"] for f in client.get(f"/api/runs/{run['id']}/files").json()}
    assert {"kineto/rank0.json.gz", "kineto/rank1.json.gz", "analysis.json",
            "trace-rank0.parquet", "trace-rank1.jsonl"} <= files


def test_public_vit_traces_agree_with_hta_through_the_engine(client):
    paths = sorted((DATA / "vit_2rank").glob("*.json.gz"))
    r = post(client, read(paths), name="vit")
    assert r.status_code == 422 and "ranks 2-127 of world size 128 are missing" in r.text
    r = post(client, read(paths), name="vit", allow_missing_ranks="true")
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["spec"]["train"]["steps"] == 2 and run["started_at"] is None  # never ran here
    a = client.get(f"/api/runs/{run['id']}/metrics").json()
    # its SendRecv kernels carry no sizes: the bytes are unknown, not 0
    assert a["headline"]["comm_bytes_per_rank"] is None
    assert any("without the profiler's collective arguments" in w for w in a["warnings"])
    hta = HTA["vit_2rank"]
    for row in a["kineto"]["temporal"]:  # HTA's own figures, recomputed on the stored run
        want = hta["temporal"][str(row["rank"])]
        assert row["compute_time_us"] == want["compute_time_us"]
        assert row["idle_time_us"] == want["idle_time_us"]
        assert abs(row["overlap_pct"] - hta["overlap_pct"][str(row["rank"])]) < 0.01
    # HTA drops the last of the two profiled steps, so the engine's first step is HTA's window:
    # the engine's compute time (union of compute kernels) is HTA's compute time
    first = {x["rank"]: x for x in a["tables"]["step_rank"] if x["step"] == 551}
    for rank in (0, 1):
        assert first[rank]["compute_s"] * 1e6 == pytest.approx(
            hta["temporal"][str(rank)]["compute_time_us"], abs=1)
        assert first[rank]["overlap_pct"] == pytest.approx(hta["overlap_pct"][str(rank)],
                                                           abs=0.01)
    # the Gantt has a lane per GPU stream per rank, holding that stream's GPU activities
    g = client.get(f"/api/runs/{r.json()['id']}/gantt",
                   params={"t0_ms": 0, "t1_ms": 1e9}).json()
    lanes = {ln["id"]: (ln["rank"], ln["channel"]) for ln in g["lanes"]}
    got: dict = {}
    for lane in g["segments"]["lane"]:
        got[lanes[lane]] = got.get(lanes[lane], 0) + 1
    assert got == _gpu_events_per_stream(paths)


def _gpu_events_per_stream(paths) -> dict:
    """Read with the standard library alone: GPU activities per (rank, stream lane)."""
    out: dict = {}
    for p in paths:
        doc = json.loads(gzip.decompress(p.read_bytes()))
        rank = doc["distributedInfo"]["rank"]
        for e in doc["traceEvents"]:
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e:
                key = (rank, f"stream {e['args']['stream']}")
                out[key] = out.get(key, 0) + 1
    return out


def _zip(files: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("trace_dir/", b"")
        for n, b in files:
            z.writestr(f"trace_dir/{n}", b)
        z.writestr("trace_dir/README.txt", b"not a trace")
    return buf.getvalue()


def _tgz(files: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for n, b in files:
            info = tarfile.TarInfo(f"../../escape/{n}")  # a hostile name: shown, never a path
            info.size = len(b)
            t.addfile(info, io.BytesIO(b))
        link = tarfile.TarInfo("link.json")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(link)
    return buf.getvalue()


@pytest.mark.parametrize("pack", [_zip, _tgz], ids=["zip", "tar.gz"])
def test_a_trace_folder_archive_imports(client, settings, gloo_traces, pack):  # noqa: F811
    r = post(client, [("traces" + (".zip" if pack is _zip else ".tar.gz"),
                       pack(read(gloo_traces)))])
    assert r.status_code == 201, r.text
    assert r.json()["world_size"] == 2
    assert not (settings.data_dir.parent / "escape").exists()


def _meta(rank: int, world: int, events: str = "[]") -> bytes:
    return (json.dumps({"schemaVersion": 1, "distributedInfo": {
        "backend": "nccl", "rank": rank, "world_size": world}})[:-1]
        + f', "traceEvents": {events}}}').encode()


def test_bad_input_names_the_file_and_stores_nothing(client, settings, gloo_traces):  # noqa: F811
    good = read(gloo_traces)
    whole = gzip.decompress(good[1][1])
    cases = [
        ([good[0], ("notes.txt", b"hi")], "notes.txt: not a trace file or archive"),
        ([good[0], ("rank-1.json", b"[1, 2]")], "rank-1.json: not a Kineto trace"),
        ([good[0], ("rank-1.json.gz", good[1][1][: len(good[1][1]) // 2])],
         "rank-1.json.gz: truncated or corrupt gzip"),
        ([good[0], ("rank-1.json", whole[: len(whole) - 40])], "rank-1.json: invalid JSON"),
        ([good[0], ("r1.json", _meta(1, 3))], "r1.json: world size 3, but rank-0.json.gz says 2"),
        ([good[0]], "ranks 1 of world size 2 are missing"),
        ([good[0], ("again.json.gz", good[0][1])], "again.json.gz: rank 0 twice"),
        ([("x.zip", b"PK not a zip")], "x.zip: not a readable .zip archive"),
        ([("empty.zip", _zip([]))], "no .json / .json.gz trace file"),
    ]
    for files, message in cases:
        r = post(client, files)
        assert r.status_code == 422, (message, r.text)
        detail = r.json()["detail"]
        assert detail[0]["loc"] == ["body", "files"] and message in detail[0]["msg"], \
            (message, detail)
        nothing_stored(client, settings)
    # a parse failure names the byte: the cut JSON ends at the file's last byte
    r = post(client, [good[0], ("rank-1.json", whole[: len(whole) - 40])])
    assert f"at byte {len(whole) - 41} of the file" in r.json()["detail"][0]["msg"] \
        or f"at byte {len(whole) - 40} of the file" in r.json()["detail"][0]["msg"]
    r = post(client, read(gloo_traces), name="")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "name"]
    nothing_stored(client, settings)


def test_the_import_limit_is_stated_in_the_error(client, settings, gloo_traces, monkeypatch):  # noqa: F811
    monkeypatch.setattr(settings, "import_max_mb", 1)
    big = ("big.json", b" " * (1 << 20) + _meta(0, 1))
    r = post(client, [*read(gloo_traces), big])
    assert r.status_code == 422, r.text
    assert "over its limit of 1,048,576 bytes (PARALAB_IMPORT_MAX_MB" in r.text
    nothing_stored(client, settings)


def test_a_submitted_run_cannot_claim_to_be_an_import(client):
    r = client.post("/api/runs", json={"kind": "import", "name": "x"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "kind"]
    assert "POST /api/imports" in r.json()["detail"][0]["msg"]


def _peak_allocated(path) -> int:
    doc = json.loads(gzip.decompress(Path(path).read_bytes()))
    return max(e["args"]["Total Allocated"] for e in doc["traceEvents"]
               if e.get("name") == "[memory]")
