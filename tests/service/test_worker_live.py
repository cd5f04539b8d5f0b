"""Worker-side live streaming: trace files shipped as whole-line chunks written at their
offsets (a retried or repeated chunk changes nothing, a gap is refused), and interpreter
warnings split from the user's log."""

from __future__ import annotations

import pytest

from backend.errors import Conflict
from backend.storage import append_at
from worker.client import BackendClient
from worker.live import OutputFilter, TraceShipper


class DiskBackend(BackendClient):
    """The backend's side of `append` (storage.append_at), in process: what the route does
    after authentication."""

    def __init__(self, root):
        super().__init__("http://127.0.0.1:9", "t")
        self.root, self.calls = root, []

    def append(self, run_id, rel, offset, data):
        self.calls.append((rel, offset, len(data)))
        append_at(self.root / rel, offset, data)


def test_append_at_is_idempotent_and_refuses_gaps(tmp_path):
    f = tmp_path / "t.jsonl"
    assert append_at(f, 0, b"a\nb\n") == 4
    assert append_at(f, 2, b"b\n") == 4  # the same chunk again
    assert append_at(f, 4, b"c\n") == 6
    assert f.read_bytes() == b"a\nb\nc\n"
    with pytest.raises(Conflict, match="offset"):
        append_at(f, 10, b"x\n")
    assert f.read_bytes() == b"a\nb\nc\n"


def test_trace_shipper_copies_whole_lines_as_the_file_grows(tmp_path):
    out, copy = tmp_path / "out", tmp_path / "copy"
    out.mkdir()
    copy.mkdir()
    backend = DiskBackend(copy)
    ship = TraceShipper(backend, "run", out, interval=3600)  # rounds driven by the test
    try:
        src = out / "trace-rank0.jsonl"
        src.write_bytes(b'{"a": 1}\n{"b": ')  # the flusher is mid-line
        assert ship.ship() == 9
        assert (copy / "trace-rank0.jsonl").read_bytes() == b'{"a": 1}\n'
        assert ship.ship() == 0  # nothing complete since
        with open(src, "ab") as f:
            f.write(b'2}\n{"c": 3}\n')
        (out / "trace-rank1.jsonl").write_bytes(b'{"r": 1}\n')
        ship.ship()
        assert (copy / "trace-rank0.jsonl").read_bytes() == src.read_bytes()
        assert (copy / "trace-rank1.jsonl").read_bytes() == b'{"r": 1}\n'
        assert backend.calls[:2] == [("trace-rank0.jsonl", 0, 9), ("trace-rank0.jsonl", 9, 18)]
    finally:
        ship.close()


def test_warnings_go_aside_with_their_source_line():
    kept, aside = [], []
    f = OutputFilter(kept.append, aside.append)
    for line in [
        "[default0]:step 0 loss 2.3",
        "[default1]:/usr/lib/torch/distributed/x.py:12: FutureWarning: `foo` is deprecated",
        "[default0]:step 1 loss 2.1",
        "[default1]:  warnings.warn(",
        "/opt/venv/torch/nn/modules/module.py:99: UserWarning: bar",
        "  return f()",
        "  indented user output stays",
        "[paralab] finished",
    ]:
        f(line)
    assert kept == ["[default0]:step 0 loss 2.3", "[default0]:step 1 loss 2.1",
                    "  indented user output stays", "[paralab] finished"]
    assert len(aside) == 4 and aside[1] == "[default1]:  warnings.warn("


def test_the_launcher_traceback_of_a_stopped_job_goes_aside():
    kept, aside = [], []
    f = OutputFilter(kept.append, aside.append)
    f("[default0]:step 5 loss 1.0")
    f.stopping = True
    for line in ["[paralab] cancel requested: stopping the job",
                 "Traceback (most recent call last):",
                 '  File "torch/distributed/run.py", line 9, in main',
                 "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got "
                 "signal: 15",
                 "[default1]:step 6 loss 0.9"]:
        f(line)
    assert kept == ["[default0]:step 5 loss 1.0", "[paralab] cancel requested: stopping the job",
                    "[default1]:step 6 loss 0.9"]
    assert len(aside) == 3
