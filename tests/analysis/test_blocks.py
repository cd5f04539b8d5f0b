"""The flusher's blocks (jobs/trace_blocks.py, jobs/analysis/storage/blocks.py): a run converted
from its blocks gives the Parquet file its JSON lines give (the loader's rules: jsonl.scan,
columnar.rank_table), row for row and metadata for metadata but `paralab.origin`; blocks that
are not the lines' twin (stale, short, a killed rank's) are noticed and the lines read."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import trace_blocks as TB
from jobs.analysis.storage import blocks, columnar, convert
from jobs.analysis.storage.jsonl import parse_file

ROOT = Path(__file__).resolve().parents[2]
ENC = json.JSONEncoder(default=str, separators=(",", ":")).encode  # the tracer's


class Shown:
    def __str__(self):
        return "shown"


def odd_records() -> list[dict]:
    """Every route a field can take: typed columns, nullable ones, args, the loader's rules
    (bad lines, `optim`, metas), other ranks, values only JSON holds."""
    mb = [None, 0, 1]
    out = [{"type": "meta", "schema": 2, "rank": 0, "world_size": 2, "coords": {"pp": 0},
            "spec": {"a": [1, 2]}}]
    for i in range(12):
        out.append({"type": "span", "rank": 0, "step": i // 4, "microbatch": mb[i % 3],
                    "name": "forward", "cat": "compute", "ts_ns": 100 + 10 * i,
                    "dur_ns": 5, "layer": i})
        out.append({"type": "comm", "rank": 0, "step": i // 4, "microbatch": 0,
                    "ts_ns": 101 + 10 * i, "dur_ns": 3, "op": "all_reduce", "axis": "dp",
                    "group": "dp", "seq": i, "group_size": 2, "payload_bytes": 64,
                    "bytes_sent": 64 if i % 2 else 64.0, "bytes_recv": 64.0,
                    "dtype": "float32", "send_bytes": [0, 64]})
    out += [
        {"type": "comm", "rank": 0, "ts_ns": 90, "dur_ns": 1, "bytes_sent": 2 ** 60},
        {"type": "mem", "rank": 0, "ts_ns": 95, "step": 0, "optim": 5, "params": 3},
        {"type": "span", "rank": 0, "name": "untimed", "dur_ns": 5},
        {"type": "span", "rank": 0, "name": "negative", "ts_ns": 5, "dur_ns": -1},
        {"type": "comm", "rank": 0, "ts_ns": 6, "dur_ns": float("nan")},
        {"type": "instant", "rank": 1, "ts_ns": 7, "name": "other rank"},
        {"type": "instant", "rank": "0", "ts_ns": 8},
        {"type": "scalars", "ts_ns": 9, "loss": None},
        {"type": "scalars", "ts_ns": 10, "loss": 0.5},
        {"type": "instant", "ts_ns": 11, "step": True, "name": 5, "is_root": 1},
        {"type": "instant", "ts_ns": 12, "x": 2 ** 70, "seq": 2 ** 70, "mb": -2 ** 63},
        {"type": "moe", "ts_ns": 13, "layer": 0, "tokens_per_expert": [1, 2]},
        {"type": "instant", "ts_ns": 14, "name": "\u00fc\u2603", "p": (1, 2), "o": Shown()},
        {"type": "instant", "ts_ns": 15, "v": float("nan"), "w": float("inf"), "z": -0.0,
         "loss": float("-inf")},
        {"type": "weird"},
        {"type": "meta", "schema": 2, "rank": 0, "note": "a later meta wins"},
        {1: "x", "type": "instant", "ts_ns": 16, None: 2},
        {"type": ["span"], "ts_ns": 17, "dur_ns": 1},
        {"type": None, "ts_ns": 18},
        {"ts_ns": 19, "name": "no type"},
        {"type": "instant", "ts_ns": 20, "name": None, "cat": "c", "async": True},
        {"type": "instant", "ts_ns": 21, "name": "n", "cat": None, "async": None},
        # a typed field of another type (jsonl.FIELD_TYPES): a bad line either way
        {"type": "comm", "rank": 0, "ts_ns": 23, "dur_ns": 1, "payload_bytes": "64"},
        {"type": "span", "rank": 0, "ts_ns": 24, "dur_ns": 1, "step": "0", "name": "s"},
        # lone surrogates (JSON "\\ud800" decodes to one): no UTF-8, so args, escaped
        {"type": "instant", "ts_ns": 22, "name": "\ud800 lone", "cat": "x\udfff", "k": "\ud83d"},
        {"type": "end", "rank": 0, "ts_ns": 500, "reason": "ok", "issued": {"dp": 12},
         "last_completed_seq": {"dp": 11}},
    ]
    return out


def write_twin(path: Path, recs: list[dict], per_block: int) -> None:
    """JSON lines and their blocks, as the flusher writes them."""
    at = 0
    with open(path, "w") as f, open(TB.blocks_path(path), "wb") as b:
        for i in range(0, len(recs), per_block):
            part = recs[i:i + per_block]
            text = "".join(ENC(r) + "\n" for r in part)
            f.write(text)
            f.flush()  # the lines before their block, as the flusher: else the lines' file,
            # closed last, can be newer than the blocks and they are not read (blocks.usable)
            b.write(TB.encode(part, at, at + len(text), ENC))
            b.flush()
            at += len(text)


def reference(path: Path, rank: int, dest: Path) -> None:
    columnar.write_rank(dest, rank, *parse_file(path, rank))


def assert_same(got: Path, want: Path, origin: bytes) -> None:
    import pyarrow.parquet as pq
    a, b = pq.ParquetFile(got), pq.ParquetFile(want)
    ma, mb = dict(a.schema_arrow.metadata), dict(b.schema_arrow.metadata)
    assert ma.pop(columnar.ORIGIN_KEY) == origin
    assert mb.pop(columnar.ORIGIN_KEY) == b"lines"
    assert ma == mb
    assert [a.metadata.row_group(i).num_rows for i in range(a.num_row_groups)] == \
        [b.metadata.row_group(i).num_rows for i in range(b.num_row_groups)]
    ta, tb = a.read(), b.read()
    assert ta.schema == tb.schema
    assert ta.to_pylist() == tb.to_pylist() or _same_nan(ta.to_pylist(), tb.to_pylist())


def assert_converts_as_lines(path: Path, origin: bytes, rank: int = 0) -> None:
    """convert_rank's file of `path` (from `origin`) is the file its lines give."""
    want = path.with_name(f"want{rank}.parquet")
    reference(path, rank, want)
    got = columnar.parquet_path(path)
    assert convert.convert_rank(path, rank, got)
    assert_same(got, want, origin)


def _same_nan(x, y) -> bool:
    """Row lists equal, NaN equal to NaN (a NaN float column value is not == itself)."""
    return json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)


def convert_twin(tmp_path: Path, recs: list[dict], per_block: int, rank: int = 0,
                 origin: bytes = b"blocks") -> None:
    path = tmp_path / f"trace-rank{rank}.jsonl"
    write_twin(path, recs, per_block)
    assert_converts_as_lines(path, origin, rank)
    # the blocks are gone with the conversion; no side file left
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [path.name, columnar.parquet_path(path).name, f"want{rank}.parquet"])


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(convert, "CHUNK_LINES", 7)
    monkeypatch.setattr(columnar, "ROW_GROUP_ROWS", 5)


@pytest.mark.parametrize("per_block", [1, 3, 7, 1000])
def test_odd_records_convert_as_their_lines(tmp_path, small, per_block):
    convert_twin(tmp_path, odd_records(), per_block)


@pytest.mark.parametrize("live", [1, 10**6])
def test_mixed_shapes_shuffled_and_displaced(tmp_path, small, monkeypatch, live):
    """Row groups from the blocks they need, or (MAX_LIVE = 1) from every block at once."""
    monkeypatch.setattr(convert, "MAX_LIVE", live)
    rng = random.Random(3)
    recs = odd_records()[1:]
    recs = [dict(rng.choice(recs)) for _ in range(600)]
    for i, r in enumerate(recs):  # stamps out of order by a few places, ties kept
        if isinstance(r.get("ts_ns"), int):
            r["ts_ns"] = i // 3 + rng.randint(0, 9)
    convert_twin(tmp_path, recs, 50)


def traced_steps(tr, steps: int, after) -> None:
    """`steps` training-loop steps on the Tracer `tr` (a step span holding 2 micro-batches of
    a forward span and an all-reduce, a memory sample; a scalars record), `after(step)` after
    each."""
    for step in range(steps):
        tr.begin_step(step)
        with tr.span("step", cat="step"):
            for mb in range(2):
                tr.microbatch = mb
                with tr.span("forward", layer=1):
                    pass
                with tr.comm("all_reduce", payload_bytes=64, group_size=2, dtype="float32"):
                    pass
            tr.microbatch = None
            tr.memory(phase="after_step", params=10)
        tr.scalars(loss=1.0 / (step + 1), step_s=0.1)
        after(step)


def test_the_tracers_own_run(tmp_path, small, monkeypatch):
    """A Tracer's file (several flushes, blocks of 7 records): blocks == lines."""
    from jobs.trace import Tracer
    monkeypatch.setattr(TB, "BLOCK_RECORDS", 7)
    tr = Tracer(tmp_path, 0, 1, sync_clock=False, meta={"backend": "gloo"},
                flush_interval_s=60)
    traced_steps(tr, 6, lambda step: step % 2 and tr.flush())
    tr.close()
    path = tmp_path / "trace-rank0.jsonl"
    assert blocks.usable(path) == TB.blocks_path(path)
    assert_converts_as_lines(path, b"blocks")
    assert not TB.blocks_path(path).exists()


def test_a_float_stamp_takes_the_lines(tmp_path, small):
    recs = odd_records() + [{"type": "span", "ts_ns": 1.5, "dur_ns": 1}]
    convert_twin(tmp_path, recs, 4, origin=b"lines")


def test_blocks_that_are_not_the_twin_are_not_read(tmp_path, small):
    recs = odd_records()
    path = tmp_path / "trace-rank0.jsonl"
    bp = TB.blocks_path(path)
    write_twin(path, recs, 5)
    assert blocks.usable(path) == bp
    whole = bp.read_bytes()
    bp.write_bytes(whole[:-3])  # a torn last block: its lines are on disk, it is not
    assert blocks.usable(path) is None
    bp.write_bytes(whole)
    with open(path, "a") as f:  # lines appended after: the blocks are older and short
        f.write(ENC({"type": "instant", "ts_ns": 3}) + "\n")
    assert blocks.usable(path) is None
    write_twin(path, recs, 5)
    text = path.read_text()
    import os
    st = TB.blocks_path(path).stat()
    path.write_text(text)  # the lines rewritten after their blocks (same size): newer
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert blocks.usable(path) is None
    # a block lost from the middle of the chain (its records on disk as lines only), the
    # last one still reaching the file's end
    write_twin(path, recs, 5)
    raw = TB.blocks_path(path).read_bytes()
    import io
    heads = [h for h, _ in TB.read_blocks(io.BytesIO(raw))]
    sizes = []
    at = 0
    for h, body in TB.read_blocks(io.BytesIO(raw)):
        n = TB.HEAD.size + len(ENC(h).encode()) + len(body)
        sizes.append((at, at + n))
        at += n
    assert len(heads) > 2 and at == len(raw)
    TB.blocks_path(path).write_bytes(raw[:sizes[1][0]] + raw[sizes[1][1]:])
    assert blocks.usable(path) is None
    assert blocks.usable(tmp_path / "trace-rank9.jsonl") is None  # no file at all
    convert_twin(tmp_path, recs, 5)  # written as twins again: read


def killed_tracer(tmp_path: Path, steps: int, setup: str = "", flush_interval_s: float = 60,
                  each_step: str = "tr.flush()", before_kill: tuple[str, ...] = ()) -> Path:
    """A real Tracer in a child process: `steps` step spans (`each_step` after each), then
    `before_kill` and os._exit(9), no close (SIGKILL-like); its JSON lines' path."""
    code = "\n".join([
        "import os, sys, time", f"sys.path.insert(0, {str(ROOT)!r})",
        "from jobs import trace_blocks", "from jobs.trace import Tracer", setup,
        f"tr = Tracer({str(tmp_path)!r}, 0, 1, sync_clock=False, "
        f"flush_interval_s={flush_interval_s})",
        f"for step in range({steps}):", "    tr.begin_step(step)",
        "    with tr.span('step', cat='step'):", "        pass", f"    {each_step}",
        *before_kill, "os._exit(9)"])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 9, p.stderr
    return tmp_path / "trace-rank0.jsonl"


def test_a_killed_rank_keeps_its_lines_and_converts_from_them(tmp_path):
    """SIGKILL-like: lines flushed, the pending block never written. The chain is short, so
    the lines are read, and the file is what they give."""
    path = killed_tracer(tmp_path, 3)
    assert path.read_text().count("\n") == 4  # meta + 3 step spans, all flushed
    assert TB.blocks_path(path).read_bytes() == b""  # fewer than BLOCK_RECORDS: not yet
    assert blocks.usable(path) is None and blocks.prefix(path) is None  # no block at all
    assert_converts_as_lines(path, b"lines")
    assert not TB.blocks_path(path).exists()  # found stale: the Parquet file stands


def test_a_hung_rank_writes_its_pending_block_and_converts_from_it(tmp_path):
    """No record for IDLE_S (a rank hung in a collective): the flusher writes the pending
    block, so the rank killed later (no close, no `end` line) still has the lines' twin."""
    path = killed_tracer(tmp_path, 3, setup="trace_blocks.IDLE_S = 0.2", flush_interval_s=0.05,
                         each_step="pass", before_kill=(
                             "path = tr.path.with_suffix('.blocks')",
                             "deadline = time.monotonic() + 30  # hung: the flusher goes on",
                             "while not path.stat().st_size and time.monotonic() < deadline:",
                             "    time.sleep(0.05)"))
    assert '"type":"end"' not in path.read_text()  # killed: no close
    assert blocks.usable(path) == TB.blocks_path(path)
    assert_converts_as_lines(path, b"blocks")


def test_use_blocks_off_reads_lines_and_leaves_the_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(convert, "USE_BLOCKS", False)
    path = tmp_path / "trace-rank0.jsonl"
    write_twin(path, odd_records(), 5)
    got = columnar.parquet_path(path)
    assert convert.convert_rank(path, 0, got)
    import pyarrow.parquet as pq
    assert pq.read_schema(got).metadata[columnar.ORIGIN_KEY] == b"lines"
    assert TB.blocks_path(path).exists()


def test_block_format_round_trip_and_kinds(tmp_path):
    recs = [{"type": "x", "a": i, "b": None if i % 2 else "s", "c": 2 ** 70 if i else 1,
             "d": [i], "e": i * 0.5, "f": bool(i % 2), "g": None} for i in range(4)]
    data = TB.encode(recs, 0, 10, ENC)
    import io
    (head, body), = list(TB.read_blocks(io.BytesIO(data)))
    kinds = {k: c[0] for k, c in zip(head["shapes"][0], head["cols"][0], strict=True)}
    assert kinds == {"type": "s", "a": "i", "b": "S", "c": "j", "d": "j", "e": "f",
                     "f": "b", "g": "n"}
    assert (head["n"], head["j0"], head["j1"]) == (4, 0, 10)
    assert list(TB.read_blocks(io.BytesIO(data[:-1]))) == []  # torn: not a block
    assert list(TB.read_blocks(io.BytesIO(b"XXXX" + data[4:]))) == []  # foreign
    f = tmp_path / "x.blocks"
    for raw, heads in ((data + data, 2), (data + data[:-1], 1), (b"XXXX" + data[4:], 0)):
        f.write_bytes(raw)
        with open(f, "rb") as fh:
            assert [h["n"] for h in TB.read_heads(fh)] == [4] * heads


def test_a_block_that_does_not_decode_falls_back_to_the_lines(tmp_path):
    """Framed and chained, but its columns point past its body (a foreign writer): the
    conversion reads the lines, and says so in the file's origin."""
    path = tmp_path / "trace-rank0.jsonl"
    recs = odd_records()
    text = "".join(ENC(r) + "\n" for r in recs)
    path.write_text(text)
    head = ENC({"n": len(recs), "j0": 0, "j1": len(text), "order": sys.byteorder,
                "shapes": [["type"]], "cols": [[["s", 0, 4 * len(recs)]]], "strs": []}).encode()
    TB.blocks_path(path).write_bytes(TB.HEAD.pack(TB.MAGIC, len(head), 2) + head + b"\0\0")
    assert blocks.usable(path) is not None  # the chain holds: only decoding finds it out
    assert_converts_as_lines(path, b"lines")


def assert_blocks_give_the_lines_file(path: Path, d: Path) -> None:
    """A run's rank file and the blocks its flusher wrote, copied into `d`: the file from the
    blocks is the file from the lines."""
    import shutil
    rank = int(path.stem.removeprefix("trace-rank"))
    d.mkdir(exist_ok=True)
    here = d / path.name
    shutil.copy2(path, here)
    shutil.copy2(TB.blocks_path(path), TB.blocks_path(here))
    assert_converts_as_lines(here, b"blocks", rank)


@pytest.mark.parametrize("which", ["zero3_run", "pp_run"])
def test_real_runs_convert_from_their_blocks_as_from_their_lines(which, request, tmp_path):
    """Real reference runs (ZeRO-3 on 4 ranks, 1F1B on 2): every rank's blocks (written by
    the job's own flusher) give the file its lines give."""
    paths = sorted(request.getfixturevalue(which).glob("trace-rank*.jsonl"))
    assert paths
    for path in paths:
        assert_blocks_give_the_lines_file(path, tmp_path)


def test_lone_surrogates_read_back_as_the_loader_parses_them(tmp_path, small):
    """A string with a lone surrogate has no UTF-8: it is kept in `args`, JSON-escaped, so the
    converted file's records are the loader's (it broke the whole run's conversion before)."""
    recs = [{"type": "instant", "rank": 0, "ts_ns": 10 + i, "name": n, "cat": "c"}
            for i, n in enumerate(["plain", "\ud800", "\u00fc\udfff", "\u2603"])]
    path = tmp_path / "trace-rank0.jsonl"
    write_twin(path, recs, 2)
    dest = columnar.parquet_path(path)
    assert convert.convert_rank(path, 0, dest)
    got, _, bad, _ = columnar.read_rank(dest)
    # (every record reads back with a `microbatch`, None here: columnar.NULL_IS_NONE)
    assert [{k: v for k, v in r.items() if k != "microbatch"} for r in got] == \
        parse_file(path, 0)[0] and bad == 0
    assert [r["name"] for r in got] == ["plain", "\ud800", "\u00fc\udfff", "\u2603"]
    import pyarrow.parquet as pq
    t = pq.read_table(dest)
    assert t.column("name").to_pylist() == ["plain", None, None, "\u2603"]  # args hold them


def write_killed(path: Path, recs: list[dict], per_block: int, cut: int,
                 torn: str = "") -> None:
    """A rank killed before its pending block: blocks and lines for recs[:cut], then the
    lines of recs[cut:] without a block (and `torn`, a last line cut mid-write)."""
    write_twin(path, recs[:cut], per_block)
    with open(path, "a") as f:
        f.write("".join(ENC(r) + "\n" for r in recs[cut:]) + torn)


@pytest.mark.parametrize("cut", [5, 20, 33, 40])
@pytest.mark.parametrize("torn", ["", '{"type": "span", "ts_'])
def test_a_killed_ranks_blocks_and_its_last_lines(tmp_path, small, cut, torn):
    """The blocks hold the lines up to the last block, the lines after it are parsed (metas,
    bad lines, a torn last line among them): the file the lines give, origin blocks+lines."""
    recs = odd_records()
    path = tmp_path / "trace-rank0.jsonl"
    write_killed(path, recs, 5, cut, torn)
    assert blocks.usable(path) is None
    bp, at = blocks.prefix(path)
    assert bp == TB.blocks_path(path) and 0 < at < path.stat().st_size
    assert_converts_as_lines(path, b"blocks+lines")
    assert not bp.exists()


def test_blocks_whose_last_lines_differ_are_not_a_prefix(tmp_path, small, monkeypatch):
    """The prefix is used only when the last block's lines are its records; a tail past
    TAIL_BYTES is left to the lines' path."""
    recs = odd_records()
    path = tmp_path / "trace-rank0.jsonl"
    write_killed(path, recs, 5, 20)
    _, at = blocks.prefix(path)
    text = path.read_bytes()
    # the last line the blocks hold, another record of the same length
    start = text.rindex(b"\n", 0, at - 1) + 1
    line = text[start:at - 1]
    other = line.replace(b'"ts_ns":', b'"ts_nx":', 1)
    assert other != line and len(other) == len(line)
    path.write_bytes(text[:start] + other + text[at - 1:])
    assert blocks.prefix(path) is None
    assert_converts_as_lines(path, b"lines")
    write_killed(path, recs, 5, 20)
    path.write_bytes(path.read_bytes().replace(b"\n", b"\n\n", 3))  # lines moved: no chain
    assert blocks.prefix(path) is None
    write_killed(path, recs, 5, 20)
    monkeypatch.setattr(convert, "TAIL_BYTES", 10)
    assert blocks.prefix(path) is not None
    assert_converts_as_lines(path, b"lines")


def test_a_killed_tracer_converts_from_its_blocks_and_its_last_lines(tmp_path):
    """SIGKILL-like with blocks written: a block per 4 records, then the pending records'
    lines flushed and the process killed before their block (before blocks.prefix, the
    whole file was parsed from its lines)."""
    path = killed_tracer(tmp_path, 6, setup="trace_blocks.BLOCK_RECORDS = 4")
    assert path.read_text().count("\n") == 7  # meta + 6 step spans, all flushed
    assert TB.blocks_path(path).stat().st_size  # a block of 4 records, 3 pending
    assert blocks.usable(path) is None and blocks.prefix(path) is not None
    assert_converts_as_lines(path, b"blocks+lines")
