"""What the native engine can take (jobs/faultspec.native_refusal): checked at spec validation
when the engine is passed, and again when a job starts (jobs/faults.install)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.faultspec import FaultSpec, fault_cross_checks, native_refusal


@pytest.mark.parametrize("kind,mode,refused", [
    ("crash", "", False), ("data_exhausted", "", False), ("nonfinite", "", False),
    ("slow", "compute", False), ("slow", "comm", True), ("hang", "", True),
    ("skip_collective", "", True), ("mismatch", "size", True)])
def test_native_takes_only_what_it_can_intercept(kind, mode, refused):
    f = FaultSpec(kind=kind, ranks=(1,), step=1, mode=mode)
    assert (native_refusal(f) is not None) is refused
    errs = fault_cross_checks((f,), 2, 5, engine="native")
    assert bool([e for e in errs if e["loc"] == ["faults", 0, "kind"]]) is refused
    assert not [e for e in fault_cross_checks((f,), 2, 5) if e["loc"][-1] == "kind"]


def test_skip_and_mismatch_target_collectives_only():
    for kind in ("skip_collective", "mismatch"):
        errs = fault_cross_checks((FaultSpec(kind=kind, ranks=(1,), step=1, op="send"),), 2, 5)
        assert [e["loc"] for e in errs] == [["faults", 0, "op"]]


def test_the_job_refuses_a_native_comm_fault_at_start(tmp_path):
    from jobs import faults
    spec = SimpleNamespace(faults=(FaultSpec(kind="hang", ranks=(1,), step=1),),
                           parallel=SimpleNamespace(engine="native"))
    with pytest.raises(ValueError, match="needs the reference engine"):
        faults.install(spec, tmp_path, 0, 2, None, None)
