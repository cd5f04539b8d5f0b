"""Bad input is a ValueError naming the file (and, for a parse failure, the byte offset);
good input is streamed, never loaded whole."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from jobs.kineto.reader import KinetoTraceReader
from jobs.kineto.records import load_rank, load_ranks

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
NCCL = DATA / "nccl_2gpu" / "rank-0.json.gz"


def _read_all(path) -> int:
    return sum(1 for _ in KinetoTraceReader(path).events())


def _offset(err: pytest.ExceptionInfo) -> int:
    m = re.search(r"at byte (\d+)", str(err.value))
    assert m, str(err.value)
    return int(m.group(1))


@pytest.mark.parametrize("text", ['[{"ph": "X"}]', '{"foo": 1, "bar": [1, 2]}', '"just a string"'])
def test_not_a_kineto_trace(tmp_path, text):
    path = tmp_path / "other.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="not a Kineto trace") as err:
        _read_all(path)
    assert str(path) in str(err.value)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.json.gz"
    path.write_bytes(gzip.compress(b""))
    with pytest.raises(ValueError, match="invalid JSON") as err:
        _read_all(path)
    assert str(path) in str(err.value) and _offset(err) == 0


def test_csv_is_invalid_json_at_byte_zero(tmp_path):
    path = tmp_path / "table.json"
    path.write_text("rank,ts\n0,1\n")
    with pytest.raises(ValueError, match="invalid JSON") as err:
        _read_all(path)
    assert str(path) in str(err.value) and _offset(err) <= 1


def test_invalid_json_reports_the_offset(tmp_path):
    # a real trace with one event broken deep inside the text (past the first 64 KiB
    # read, so the offset cannot be a chunk boundary by luck)
    text = gzip.open(NCCL, "rt").read()
    bad_at = text.index('"ph": "X"', 200_000)
    broken = text[:bad_at] + '"ph": Xx' + text[bad_at + len('"ph": "X"'):]
    path = tmp_path / "rank-0.json"
    path.write_text(broken)
    with pytest.raises(ValueError, match="invalid JSON") as err:
        _read_all(path)
    assert str(path) in str(err.value)
    assert bad_at + len('"ph": ') <= _offset(err) <= bad_at + len('"ph": Xx')
    # the same text gzipped: the offset is into the uncompressed JSON
    gz = tmp_path / "rank-0.json.gz"
    gz.write_bytes(gzip.compress(broken.encode()))
    with pytest.raises(ValueError, match="uncompressed JSON") as err:
        _read_all(gz)
    assert bad_at + len('"ph": ') <= _offset(err) <= bad_at + len('"ph": Xx')


def test_truncated_json_reports_end_of_file(tmp_path):
    text = gzip.open(NCCL, "rb").read()[:300_000]
    path = tmp_path / "cut.json"
    path.write_bytes(text)
    with pytest.raises(ValueError, match="invalid JSON") as err:
        _read_all(path)
    assert str(path) in str(err.value) and _offset(err) >= len(text) - 1


def test_truncated_gzip(tmp_path):
    data = NCCL.read_bytes()
    path = tmp_path / "rank-0.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt gzip") as err:
        load_rank(path)
    assert str(path) in str(err.value)
    assert 0 < _offset(err) < len(gzip.decompress(data))


def test_missing_file_and_rank_twice(tmp_path):
    with pytest.raises(ValueError, match="no such trace file"):
        KinetoTraceReader(tmp_path / "absent.json")
    twin = tmp_path / "copy.json.gz"
    shutil.copy(NCCL, twin)
    with pytest.raises(ValueError, match="rank 0 already read"):
        load_ranks([NCCL, twin])


def test_ranks_disagree_on_world_size():
    # rank 0 of 2 (nccl_2gpu) and rank 3 of 8 (rank3_of8) cannot be one job
    with pytest.raises(ValueError, match="world size 8 but .* says 2"):
        load_ranks([NCCL, DATA / "rank3_of8" / "rank-3.json.gz"])


def test_reader_streams_without_json_load(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("whole-file json load")

    monkeypatch.setattr(json, "load", refuse)
    r = KinetoTraceReader(NCCL)
    n = sum(1 for _ in r.events())
    oracle = json.loads(gzip.decompress(NCCL.read_bytes()))
    assert n == len(oracle["traceEvents"])
    assert r.distributed_info == oracle["distributedInfo"]
    assert r.device_properties == oracle["deviceProperties"]
