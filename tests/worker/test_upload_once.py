"""The upload after a job sends each byte once (worker/tasks.py JobSupervisor._upload): a
trace file the backend holds whole from the live shipment is sealed (recorded from its copy),
anything else is uploaded, streamed from disk. A fake backend client records the calls."""

from __future__ import annotations

import httpx

from worker.client import FileBody
from worker.tasks import JobSupervisor


class FakeClient:
    def __init__(self, refuse=()):
        self.sealed, self.uploaded, self.refuse = [], {}, set(refuse)

    def seal(self, run_id, rel, size):
        if rel in self.refuse:  # the backend's copy is not that size
            req = httpx.Request("POST", "http://x")
            raise httpx.HTTPStatusError("409", request=req, response=httpx.Response(409,
                                                                                 request=req))
        self.sealed.append((rel, size))

    def upload(self, run_id, rel, path):
        self.uploaded[rel] = b"".join(FileBody(path))


def supervisor(tmp_path, client, shipped):
    s = JobSupervisor.__new__(JobSupervisor)
    s.run_id, s.client, s.dir, s.out = "r1", client, tmp_path, tmp_path / "out"
    s.shipped, s.said = shipped, []
    s.say = s.said.append
    s.out.mkdir(parents=True)
    (tmp_path / "spec.json").write_text("{}")
    for rank, body in enumerate((b'{"a": 1}\n' * 3, b'{"b": 2}\n' * 5, b'{"c": 3}\n')):
        (s.out / f"trace-rank{rank}.jsonl").write_bytes(body)
    (s.out / "summary.json").write_text('{"loss": []}')
    return s


def test_shipped_traces_are_sealed_the_rest_uploaded(tmp_path):
    c = FakeClient()
    # rank 0 shipped whole (27 bytes), rank 1 only in part (its last 9 bytes were not),
    # rank 2 never shipped
    s = supervisor(tmp_path, c, {"trace-rank0.jsonl": 27, "trace-rank1.jsonl": 36})
    s._upload()
    assert c.sealed == [("trace-rank0.jsonl", 27)]
    assert set(c.uploaded) == {"spec.json", "trace-rank1.jsonl", "trace-rank2.jsonl",
                               "summary.json"}
    assert c.uploaded["trace-rank1.jsonl"] == b'{"b": 2}\n' * 5  # whole, from disk
    assert s.said == ["trace-rank0.jsonl: shipped live while the job ran, recorded without a "
                      "second upload"]


def test_a_refused_seal_falls_back_to_the_whole_upload(tmp_path):
    c = FakeClient(refuse={"trace-rank0.jsonl"})
    s = supervisor(tmp_path, c, {"trace-rank0.jsonl": 27})
    s._upload()
    assert c.sealed == [] and c.uploaded["trace-rank0.jsonl"] == b'{"a": 1}\n' * 3


def test_a_file_body_is_read_again_for_a_retry(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * (3 * FileBody.CHUNK + 5))
    body = FileBody(p)
    first, again = b"".join(body), b"".join(body)
    assert first == again == p.read_bytes()
