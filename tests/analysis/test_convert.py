"""The streamed JSON-lines -> Parquet conversion (jobs/analysis/storage/convert.py) writes the file
the in-memory path writes (parse every line, sort the dicts, write): same rows in the same
order, same metadata, same row groups; with chunks and row groups a few rows long, so a file
meets many of both, in order, displaced as the tracer writes, and out of order."""

from __future__ import annotations

import json
import random

import pytest

from jobs.analysis.storage import columnar, convert
from jobs.analysis.storage.jsonl import parse_file
from tests.analysis.test_columnar import dp_tp_run


def reference(path, rank, dest):
    columnar.write_rank(dest, rank, *parse_file(path, rank))


def assert_same_file(got, want):
    import pyarrow.parquet as pq
    a, b = pq.ParquetFile(got), pq.ParquetFile(want)
    assert a.schema_arrow.metadata == b.schema_arrow.metadata
    assert [a.metadata.row_group(i).num_rows for i in range(a.num_row_groups)] == \
        [b.metadata.row_group(i).num_rows for i in range(b.num_row_groups)]
    ta, tb = a.read(), b.read()
    assert ta.schema == tb.schema
    assert ta.to_pylist() == tb.to_pylist()  # row by row: a wrong order shows here


def convert_both(tmp_path, lines, rank=0):
    path = tmp_path / f"trace-rank{rank}.jsonl"
    path.write_text("".join(x + "\n" for x in lines))
    want = tmp_path / "want.parquet"
    reference(path, rank, want)
    got = columnar.parquet_path(path)
    assert convert.convert_rank(path, rank, got)
    assert_same_file(got, want)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [path.name, got.name, want.name])  # no `.rows` / `.part` file left behind
    return got


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(convert, "IN_MEMORY_BYTES", -1)  # every file streamed
    monkeypatch.setattr(convert, "CHUNK_LINES", 7)
    monkeypatch.setattr(columnar, "ROW_GROUP_ROWS", 5)


def displaced(rng, n, reach):
    """Records of stamps 0..n-1 (ties: every 4th repeats the one before) written in the
    order a tracer writes them: each record late by up to `reach` places."""
    recs = [{"type": "span", "rank": 0, "name": f"r{i}", "ts_ns": i - (i % 4 == 3),
             "dur_ns": 1, "step": i // 10} for i in range(n)]
    keyed = sorted(range(n), key=lambda i: i + rng.randint(0, reach))
    return [json.dumps(recs[i]) for i in keyed]


@pytest.mark.parametrize("reach", [0, 3, 12, 40])
def test_displaced_records_stream_into_the_in_memory_file(tmp_path, small, monkeypatch, reach):
    """Within MAX_LIVE chunks of their place (16 x 7 lines): never every chunk at once."""
    def not_all(reader, n):
        raise AssertionError(f"all {n} chunks held for records displaced by {reach}")
    monkeypatch.setattr(convert, "_all_chunks", not_all)
    lines = displaced(random.Random(reach), 300, reach)
    lines.insert(0, json.dumps({"type": "meta", "rank": 0, "schema": 1}))
    convert_both(tmp_path, lines)


@pytest.mark.parametrize("live", [1, 2, 10**6])
def test_out_of_order_file_in_either_mode(tmp_path, small, monkeypatch, live):
    """Reversed with shuffled blocks: many chunks per row group; MAX_LIVE picks between
    holding the chunks a group needs and holding all of them: same file both ways."""
    monkeypatch.setattr(convert, "MAX_LIVE", live)
    rng = random.Random(live)
    lines = displaced(rng, 200, 0)[::-1]
    blocks = [lines[i:i + 9] for i in range(0, len(lines), 9)]
    rng.shuffle(blocks)
    convert_both(tmp_path, [x for b in blocks for x in b])


def test_the_loaders_line_rules_across_chunks(tmp_path, small):
    """Metas, torn and foreign lines, blanks and records without a stamp, spread over chunk
    boundaries: the last meta wins, every bad line is counted once, key 0 for no stamp, a
    rank field that disagrees with the file kept, bool stamps ordered as ints."""
    lines = []
    for i in range(60):
        lines.append(json.dumps({"type": "comm", "rank": 0, "ts_ns": 1000 - 10 * i,
                                 "dur_ns": 3, "op": "all_reduce", "bytes_sent": i}))
        if i % 5 == 0:
            lines.append(json.dumps({"type": "meta", "rank": 0, "n": i}))
        if i % 7 == 0:
            lines += ['{"type": "span", "ts_', "", "[1, 2]", '{"type": "span", "dur_ns": 1}']
        if i % 11 == 0:
            lines += [json.dumps({"type": "weird", "rank": 2, "x": [i]}),
                      json.dumps({"type": "instant", "ts_ns": True, "name": "b"})]
    got = convert_both(tmp_path, lines)
    recs, meta, bad, empty = columnar.read_rank(got)
    assert meta["n"] == 55 and bad == 9 * 3 and not empty
    assert [r["ts_ns"] for r in recs if r["type"] == "comm"][:3] == [410, 420, 430]


def test_a_float_stamp_takes_the_in_memory_path(tmp_path, small):
    lines = displaced(random.Random(1), 40, 5)
    # first in the file, after stamp 12 in order: as an int it would sort before it
    lines.insert(0, json.dumps({"type": "span", "ts_ns": 12.5, "dur_ns": 1, "name": "f"}))
    convert_both(tmp_path, lines)
    lines[17] = json.dumps({"type": "weird", "ts_ns": 1 << 70})  # beyond int64
    (tmp_path / "want.parquet").unlink()
    (tmp_path / "trace-rank0.parquet").unlink()
    convert_both(tmp_path, lines)


@pytest.mark.parametrize("lines", [[], ["", "  "], ['{"type": "meta", "rank": 0}', "{"]])
def test_files_without_records(tmp_path, small, lines):
    got = convert_both(tmp_path, lines)
    assert columnar.read_rank(got)[1:] == (
        ({"type": "meta", "rank": 0}, 1, False) if lines and lines[0] else ({}, 0, True))


def test_a_whole_run_folder(tmp_path, small):
    """convert_run_dir over dp_tp_run's four ranks (a torn last line in rank 3)."""
    run = dp_tp_run(tmp_path / "run", steps=5)
    written = convert.convert_run_dir(run)
    assert [p.name for p in written] == [f"trace-rank{r}.parquet" for r in range(4)]
    for r, got in enumerate(written):
        want = tmp_path / f"want{r}.parquet"
        reference(run / f"trace-rank{r}.jsonl", r, want)
        assert_same_file(got, want)


def test_an_unreadable_rank_file_is_left_to_the_loader(tmp_path):
    (tmp_path / "trace-rank0.jsonl").mkdir()  # open() raises, as for a file gone unreadable
    assert convert.convert_run_dir(tmp_path) == []
    assert [p.name for p in tmp_path.iterdir()] == ["trace-rank0.jsonl"]
