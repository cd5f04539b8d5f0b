"""jobs.torchrun.tail_logfile, what tails each tee'd rank stream in place of torch's: the same
lines as torch's own (the oracle: torch's tail_logfile on the same file, filter and header),
and woken by `finished` instead of sleeping out its interval (torch's slept 0.1 s first, and
every launch with `--tee` waited for it; here the interval is an hour and the guard 30 s).
quick_tail swaps it in only over a torch whose function has the signature it was written for."""

from __future__ import annotations

import io
import threading

import pytest
from torch.distributed.elastic.multiprocessing import tail_log

from jobs import torchrun


def _run(fn, path, finished, interval):
    dst = io.StringIO()
    fn("[r1]:", str(path), dst, finished, interval, lambda line: "skip" not in line)
    return dst.getvalue()


def test_same_lines_as_torchs_own(tmp_path):
    path = tmp_path / "stdout.log"
    path.write_text("a\nskip me\nb\nlast without newline")
    done = threading.Event()
    done.set()  # the producer has finished: both read to EOF and stop
    want = _run(tail_log.tail_logfile, path, done, 0.01)
    assert want == "[r1]:a\n[r1]:b\n[r1]:last without newline"  # by hand too
    assert _run(torchrun.tail_logfile, path, done, 0.01) == want


@pytest.mark.parametrize("exists", [False, True], ids=["before-the-file", "at-eof"])
def test_woken_by_finished_with_the_lines_written_meanwhile(tmp_path, exists):
    path = tmp_path / "stdout.log"
    if exists:
        path.write_text("x\n")
    finished, out = threading.Event(), []
    t = threading.Thread(target=lambda: out.append(
        _run(torchrun.tail_logfile, path, finished, 3600.0)), daemon=True)
    t.start()  # waiting for the file, or at its end
    t.join(0.2)
    assert t.is_alive()
    with open(path, "a") as f:
        f.write("y\n" if exists else "x\ny\n")
    finished.set()
    t.join(30)
    assert not t.is_alive(), "slept out its interval"
    assert out == ["[r1]:x\n[r1]:y\n"]


def test_swapped_in_only_over_the_signature_it_knows(monkeypatch):
    monkeypatch.setattr(tail_log, "tail_logfile", tail_log.tail_logfile)  # restored after
    assert torchrun.quick_tail() is True  # the pinned torch
    assert tail_log.tail_logfile is torchrun.tail_logfile

    def other(header, file, dst, finished, interval_sec, log_line_filter=None, extra=None):
        pass
    monkeypatch.setattr(tail_log, "tail_logfile", other)
    assert torchrun.quick_tail() is False and tail_log.tail_logfile is other
