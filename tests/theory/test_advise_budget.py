"""Issue 36: the advisor's search counted before it runs (jobs.theory.budget) and its memos
bounded in bytes (jobs.theory.bytecache). Oracles: the search's own loop counts, the
simulator's actual calls, an independent walk of what the cache holds, tracemalloc."""

from __future__ import annotations

import gc
import importlib
import sys
import tracemalloc

import pytest

from jobs.spec import SpecError
from jobs.theory.advisor import EVALUATED, advise, configure_caches, enumerate_layouts
from jobs.theory.advisor_input import check_request
from jobs.theory.budget import Budget, search_size
from jobs.theory.bytecache import CACHE_BYTES

P = importlib.import_module("jobs.theory.predict")  # the module, not the function
GPT3B = {"arch": "gpt", "layers": 32, "hidden": 2560, "heads": 32, "seq_len": 2048,
         "vocab": 50304}
MOE = {**GPT3B, "layers": 8, "experts": 8, "top_k": 2}
TIMED = {"arch": "timed", "layers": 8, "hidden": 8}
CLUSTER = {"device_memory_bytes": 80e9, "intra_GBps": 300, "inter_GBps": 25, "flops": 3e14}


@pytest.fixture
def caches():
    configure_caches(CACHE_BYTES)
    EVALUATED.clear()
    P.SIMULATED.clear()
    yield
    configure_caches(CACHE_BYTES)
    EVALUATED.clear()
    P.SIMULATED.clear()


@pytest.mark.parametrize("model, batch, hosts, per", [
    (GPT3B, 512, 1, 8), (GPT3B, 64, 2, 8), (MOE, 32, 1, 8), (TIMED, 8, 1, 4)])
def test_the_count_is_what_the_search_evaluates_and_simulates(caches, monkeypatch, model,
                                                              batch, hosts, per):
    m, c, fix = check_request(model, batch, {**CLUSTER, "hosts": hosts, "devices_per_host": per})
    size = search_size(enumerate_layouts(m, batch, hosts, per, fix))
    ran = []
    real = P.schedules.simulate
    monkeypatch.setattr(P.schedules, "simulate",
                        lambda s, p, mb, v, *a: ran.append(p * mb * v * 3) or real(s, p, mb, v,
                                                                                   *a))
    out = advise(model, batch, {**CLUSTER, "hosts": hosts, "devices_per_host": per})
    n = out["counts"]
    assert size["candidates"] == n["considered"] - sum(n["pruned"].values()) > 0
    assert size["layouts"] == n["considered"] and size["complete"]
    # an upper bound of the simulator's work (the memo was empty), and not a loose one: it
    # counts the pipelines of candidates that the spec then refuses too, nothing more; the
    # second pass (smaller micro-batches where none fits, issue 38) is counted before it runs
    second = out["search"]["smaller_micro_batches"]
    assert second["ran"] and second["candidates"] == second["counts"]["considered"] - sum(
        second["counts"]["pruned"].values())
    assert 0 < sum(ran) <= size["sim_actions"] + second["sim_actions"] <= 2 * sum(ran)


def test_a_budget_refuses_before_anything_is_evaluated(caches, monkeypatch):
    monkeypatch.setattr(P, "predict", lambda *a, **k: pytest.fail("evaluated"))
    budget = Budget(layouts=10**6, candidates=805, sim_actions=10**9)
    with pytest.raises(SpecError) as e:
        advise(GPT3B, 512, {**CLUSTER, "hosts": 1, "devices_per_host": 8}, budget=budget)
    [err] = e.value.errors
    assert err["loc"] == ["cluster"] and err["type"] == "search_budget"
    assert "806 candidate layouts" in err["msg"] and "bound of 805" in err["msg"]
    assert len(EVALUATED) == 0


def _held(obj, seen=None) -> int:
    """Bytes an object holds, walked here (not the module's walk)."""
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_held(k) + _held(v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        size += sum(_held(x) for x in obj)
    return size


def test_the_memos_stay_within_their_bytes_after_many_distinct_requests(caches):
    bound = 256 << 10
    configure_caches(bound)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for hidden in range(8, 8 + 24):  # 24 distinct requests, ~70 KB of evaluations each
            advise({**TIMED, "hidden": hidden}, 8, {**CLUSTER, "hosts": 1,
                                                   "devices_per_host": 8})
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert kept <= 2 * bound + (256 << 10)  # the two memos, and a little else
    held = EVALUATED.items()
    assert sum(_held(k) + _held(v) for k, v in held) <= bound
    # least recently used evicted: the last request's evaluations are there, the first's not
    assert any('"hidden": 31' in k[0] for k, _ in held)
    assert not any('"hidden": 8,' in k[0] for k, _ in held)
