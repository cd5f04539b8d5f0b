"""What a killed API process leaves half-written (a run file's hidden temporary copy, an
upload's temporary file, an import's staging folder) is removed when the API starts again, and
only that: a younger one (another process may be writing it now) and every other file stay.
Oracles: the files the test itself made, and which of them exist afterwards."""

from __future__ import annotations

import os
import time

from fastapi.testclient import TestClient

from backend import storage
from backend.core.config import Settings
from backend.main import create_app
from backend.migrate import upgrade

HOUR = 3600.0


def _make(path, *, age_s: float, now: float, text: str = "x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (now - age_s, now - age_s))
    return path


def _tree(s: Settings, now: float) -> tuple[list, list]:
    """(what a sweep must remove, what it must keep)."""
    run = s.runs_dir / "r1"
    stale = [_make(run / "traces" / ".trace-rank0.jsonl.0123456789ab.part", age_s=2 * HOUR,
                   now=now),
             _make(run / ".analysis.json.abcdefabcdef.part", age_s=2 * HOUR, now=now),
             _make(s.uploads_dir / ".tmp-0123456789abcdef", age_s=2 * HOUR, now=now)]
    stage = s.data_dir.resolve() / "imports" / "body-0123456789abcdef"
    _make(stage / "upload-0.json", age_s=2 * HOUR, now=now)
    os.utime(stage, (now - 2 * HOUR, now - 2 * HOUR))
    stale.append(stage)
    keep = [_make(run / "traces" / ".trace-rank1.jsonl.0123456789ab.part", age_s=60, now=now),
            _make(run / "traces" / "trace-rank0.jsonl", age_s=2 * HOUR, now=now),
            _make(run / ".hidden.part", age_s=2 * HOUR, now=now),  # not PartFile's name
            _make(run / ".x.0123456789AB.part", age_s=2 * HOUR, now=now),  # (upper-case hex)
            _make(s.uploads_dir / ("a" * 64 + ".tgz"), age_s=2 * HOUR, now=now),
            _make(s.uploads_dir / ".tmp-0123456789abcdee", age_s=60, now=now)]
    young = s.data_dir.resolve() / "imports" / "body-fedcba9876543210"
    _make(young / "upload-0.json", age_s=60, now=now)
    keep.append(young)
    return stale, keep


def test_the_sweep_removes_only_old_leftovers(tmp_path):
    s = Settings(data_dir=tmp_path / "var")
    now = time.time()
    stale, keep = _tree(s, now)
    gone = storage.sweep_leftovers(s, now=now)
    assert sorted(map(str, gone)) == sorted(map(str, stale))
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in keep)
    # a PartFile in progress right now has a name the sweep recognises (the rule is its own)
    part = storage.PartFile(s.runs_dir / "r2" / "f.bin")
    assert part.tmp in storage.sweep_leftovers(s, older_than_s=-1, now=time.time() + 1)
    part.discard()


def test_the_api_sweeps_when_it_starts(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url)
    s = Settings(data_dir=tmp_path / "var", database_url=url)
    stale, keep = _tree(s, time.time())
    with TestClient(create_app(s)) as client:
        for _ in range(500):  # the sweep runs beside startup: until it is done (a condition)
            if not any(p.exists() for p in stale):
                break
            time.sleep(0.01)
        assert client.get("/api/health/live").status_code == 200
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in keep)
