"""Presets through the service (real backend, worker and torchrun): one of each kind the
service handles differently (a data-parallel preset, the 8-rank 3D preset with every mesh axis,
and the collective sweep) succeeds, and its summary and metrics carry what its strategy is
about (tests/support/summary.py). The service has no per-strategy code but the worker's
analysis (`write_analysis`), so every other preset's summary and analysis headline are checked
on cheap in-process-group runs instead (tests/analysis/test_memory_presets.py)."""

import pytest

from jobs.spec import AVAILABLE, KINDS, PRESETS, parse_spec
from tests.conftest import embedded_service
from tests.support.summary import check_train_summary

# the runs go one after another on one worker slot: slower on a loaded 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FINISHED = ("succeeded", "failed", "cancelled", "timed_out")
SMALL = {"train": {"steps": 2}}
THROUGH_SERVICE = ("zero3", "3d", "collective-sweep", "compute-calibration")
BENCH_BODY = {"collective_bench": {"collective": {"max_bytes": 1 << 14}},
              "compute_bench": {"compute": {"batch": 4, "warmup": 1, "iters": 3}}}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    yield from embedded_service(tmp_path_factory.mktemp("presets"))


def test_every_preset_is_available():
    missing = [n for n in PRESETS if parse_spec({"preset": n}).strategy not in AVAILABLE]
    assert missing == []


def test_the_service_runs_one_preset_of_each_kind(service):
    svc = service
    kinds = {PRESETS[n].overrides.get("kind", "train") for n in THROUGH_SERVICE}
    # a script run is no preset (it needs an uploaded working directory): it goes through the
    # service in tests/service/test_script_runs.py
    assert kinds | {"script"} == set(KINDS)
    assert max(parse_spec({"preset": n}).world_size for n in PRESETS) == \
        parse_spec({"preset": "3d"}).world_size  # the largest launch goes through the service
    bodies = {name: {"preset": name, "name": f"preset {name}",
                     **BENCH_BODY.get(PRESETS[name].overrides.get("kind"), SMALL)}
              for name in THROUGH_SERVICE}
    runs = {name: svc.submit(body) for name, body in bodies.items()}
    for name, run in runs.items():
        done = svc.wait_status(run["id"], FINISHED, 600)
        assert done["status"] == "succeeded", (name, done["error"])
        s = done["summary"]
        if PRESETS[name].overrides.get("kind") == "collective_bench":
            assert s["all_correct"] and all(r["busbw_GBps"] > 0 for r in s["results"])
            continue
        if PRESETS[name].overrides.get("kind") == "compute_bench":
            assert s["median_flops_per_s"] > 0 and len(s["results"]) == done["world_size"]
            continue
        spec = parse_spec(run["spec"])
        assert done["world_size"] == spec.world_size, name
        check_train_summary(name, spec, s,
                            svc.http.get(f"/api/runs/{run['id']}/metrics").json())
