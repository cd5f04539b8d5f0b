"""The worker's hang watchdog on an injected clock and hand-written flight files: when it
fires, and when it must not (start-up, a restart between attempts, steady progress)."""

import json

from worker.hang import HangWatch, LogTail

S = 1_000_000_000


def flight(out, rank, last_ns):
    (out / f"flight-rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "last_progress_ns": last_ns, "groups": {}}))


def test_fires_only_after_the_timeout_without_progress_on_any_rank(tmp_path):
    now = [100 * S]
    w = HangWatch(tmp_path, 5.0, clock=lambda: now[0], poll_s=0)
    flight(tmp_path, 0, 100 * S)
    flight(tmp_path, 1, 101 * S)
    now[0] = 105 * S
    assert w.stalled_s() is None  # 4 s since rank 1's last completion
    now[0] = 106 * S + 1
    assert w.stalled_s() is not None and abs(w.stalled_s() - 5.0) < 1e-6
    flight(tmp_path, 0, 106 * S)  # rank 0 completes a collective: progress again
    assert w.stalled_s() is None


def test_a_stall_after_a_rank_left_is_a_failure_ending_not_a_hang(tmp_path):
    """2 ranks started here, 5 s timeout. Both alive and stalled: hung. One gone (it crashed;
    torchrun is stopping the other): not hung until the stall outlasts a second timeout. None
    alive: never (the job is ending)."""
    now = [100 * S]
    w = HangWatch(tmp_path, 5.0, clock=lambda: now[0], poll_s=0)
    flight(tmp_path, 0, 100 * S)
    now[0] = 106 * S
    stalled = w.stalled_s()
    assert stalled is not None and abs(stalled - 6.0) < 1e-6
    assert w.hung(stalled, alive=2, local_ranks=2)
    assert not w.hung(stalled, alive=1, local_ranks=2)
    assert not w.hung(stalled, alive=0, local_ranks=2)
    now[0] = 109 * S + S // 2  # 9.5 s: still within the second timeout
    assert not w.hung(w.stalled_s(), alive=1, local_ranks=2)
    now[0] = 110 * S  # 10 s = two timeouts: the leaver's failure did not end the job
    assert w.hung(w.stalled_s(), alive=1, local_ranks=2)
    assert not w.hung(w.stalled_s(), alive=0, local_ranks=2)


def test_start_up_and_restarts_do_not_count(tmp_path):
    now = [0]
    w = HangWatch(tmp_path, 2.0, clock=lambda: now[0], poll_s=0)
    now[0] = 60 * S  # a minute of imports and rendezvous, no flight file yet
    assert w.stalled_s() is None
    flight(tmp_path, 0, 59 * S)  # the tracer's first file: its creation is the first progress
    now[0] = 61 * S
    assert w.stalled_s() is None
    now[0] = 62 * S  # 2 s since the watchdog last saw no file: not more than the timeout
    assert w.stalled_s() is None
    now[0] = 63 * S
    assert w.stalled_s() is not None
    (tmp_path / "flight-rank0.json").unlink()  # torchrun restarts: the ranks moved the files
    now[0] = 100 * S
    assert w.stalled_s() is None


def test_off_when_zero(tmp_path):
    now = [0]
    w = HangWatch(tmp_path, 0.0, clock=lambda: now[0], poll_s=0)
    flight(tmp_path, 0, 0)
    now[0] = 10**6 * S
    assert w.stalled_s() is None


def test_log_tail_keeps_the_last_lines():
    t = LogTail(3)
    for i in range(5):
        t(f"line {i}")
    assert t.text() == "line 2\nline 3\nline 4"
