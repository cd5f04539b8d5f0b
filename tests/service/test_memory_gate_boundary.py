"""The memory gate at its boundary (docs: a run is refused when its predicted per-rank memory
EXCEEDS the device memory the queue's workers report): a run predicted to need exactly the
device's memory is let through, one byte more is refused with the numbers. The prediction is
the gate's input here, not the oracle: the worker reports need, need - 1 bytes by hand. On
both databases, no processes."""

from __future__ import annotations

import pytest

from backend import crud
from backend.core.db import get_sessionmaker
from backend.services import runs
from jobs.spec import parse_spec

MLP = {"preset": "ddp", "model": {"arch": "mlp"}, "train": {"steps": 2}}


@pytest.fixture
def db(settings):
    with get_sessionmaker(settings.db_url)() as session:
        yield session


def _gpu_worker(db, queue: str, memory_bytes: int) -> None:
    crud.upsert_worker(db, name=f"{queue}@h1", host="h1", queue=queue, slots=1, busy=0,
                       devices=[{"type": "cuda", "name": "gpu", "memory_bytes": memory_bytes}],
                       info={"ranks": 2})


def test_exactly_the_device_memory_fits_one_byte_more_is_refused(db, settings):
    spec = parse_spec(MLP)
    need = runs.predict(spec)["memory"]["per_rank_bytes"]
    assert need > 1
    assert runs.memory_gate(db, settings, spec) is None  # no worker reported: nothing to compare
    _gpu_worker(db, spec.runtime.queue, need)
    assert runs.memory_gate(db, settings, spec) is None
    _gpu_worker(db, spec.runtime.queue, need - 1)  # the same worker now reports one byte less
    err = runs.memory_gate(db, settings, spec)
    assert err is not None and err["type"] == "memory_gate"
    assert "exceeds the" in err["msg"] and "force=true" in err["msg"]
