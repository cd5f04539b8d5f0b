"""Every preset of GET /api/presets, submitted through the service (real backend, worker and
torchrun), succeeds, and its summary carries what its strategy is about: per-rank bytes and
memory by category for the data-parallel family, per-stage bubble / per-axis bytes /
per-stage memory for model parallelism, verified busbw rows for the collective sweep, and the
analysis headline for every training run."""

import pytest

from jobs.spec import AVAILABLE, PRESETS, parse_spec
from tests.conftest import embedded_service

# every preset runs one after another on one worker slot: minutes on a quiet 2-core machine,
# several times that on a loaded one, so the per-test default (300 s) is too tight
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

FINISHED = ("succeeded", "failed", "cancelled", "timed_out")
SMALL = {"train": {"steps": 2}}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    yield from embedded_service(tmp_path_factory.mktemp("presets"))


def test_every_preset_is_available():
    missing = [n for n in PRESETS if parse_spec({"preset": n}).strategy not in AVAILABLE]
    assert missing == []


def test_every_preset_runs_from_the_service(service):
    svc = service
    bodies = {name: {"preset": name, "name": f"preset {name}",
                     **({"collective": {"max_bytes": 1 << 14}}
                        if PRESETS[name].overrides.get("kind") == "collective_bench"
                        else SMALL)} for name in PRESETS}
    runs = {name: svc.submit(body) for name, body in bodies.items()}
    for name, run in runs.items():
        done = svc.wait_status(run["id"], FINISHED, 600)
        assert done["status"] == "succeeded", (name, done["error"])
        s = done["summary"]
        kind = PRESETS[name].overrides.get("kind", "train")
        if kind == "collective_bench":
            assert s["all_correct"] and all(r["busbw_GBps"] > 0 for r in s["results"])
            continue
        assert len(s["loss"]) == 2 and s["provenance"]["torch"], name
        assert done["metrics"] and done["metrics"].get("step_time_s"), (name, done["metrics"])
        ranks = s["ranks"]
        assert len(ranks) == done["world_size"], name
        assert all(r["memory"]["peak_bytes"]["params"] > 0 for r in ranks), name
        spec = parse_spec(run["spec"])
        if spec.parallel.tp > 1 or spec.parallel.pp > 1:
            stages = s["pipeline"]["stages"]
            assert len(stages) == spec.parallel.pp, name
            assert all("idle_fraction" in st and "peak_activation_bytes" in st
                       for st in stages.values()), name
            axes = {a for per_rank in s["bytes_by_axis"].values() for a in per_rank}
            expected = {a for a, d in (("tp", spec.parallel.tp), ("pp", spec.parallel.pp),
                                       ("dp", spec.parallel.dp)) if d > 1}
            assert expected <= axes, (name, axes)
        else:
            assert all(r["comm"] for r in ranks), name
            assert s["formula_check"], name
