"""Bounded work per advise request (issue 36; docs/advisor.md, "Bounds"): the size of a search,
counted before any layout is evaluated, against a budget.

Budget(layouts, candidates, sim_actions)
    layouts      layouts enumerated, pruned ones included (what counting the search costs)
    candidates   layouts evaluated: each a spec parsed and predicted (jobs.theory.predict)
    sim_actions  schedule-simulator actions over the distinct simulations the candidates need
                 (predict memoises the simulator: one run per distinct schedule, p, m, v and
                 stage times, which within one search are fixed by the layout's
                 activation_checkpointing)
    Counts, not clocks: the same request gets the same answer on any machine at any load. The
    service's figures are Settings (backend/core/config.py, PARALAB_ADVISE_MAX_*).

search_size(layouts, budget) -> {"layouts", "candidates", "sim_actions", "complete"}
    layouts: jobs.theory.advisor.enumerate_layouts' (layout, pruned reason | None) pairs;
    counting stops once they pass budget.layouts (complete False: the figures are lower
    bounds), so counting costs at most that many cheap steps however wide the search.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec import SpecError

from .predict import simulated_microbatches

# how a request over a bound can be narrowed (the advisor's request fields)
NARROW = ("narrow the request: fewer cluster.hosts or cluster.devices_per_host, a fixed "
          "fix.tp / fix.pp (or fix.microbatches, fix.zero_stage, fix.cp, fix.ep), or a "
          "global_batch with fewer divisors")
# what each bound counts, and the setting that holds it in the service
WHAT = {"layouts": ("layouts to enumerate (pruned ones included)", "PARALAB_ADVISE_MAX_LAYOUTS"),
        "candidates": ("candidate layouts to evaluate (each a spec parsed and predicted)",
                       "PARALAB_ADVISE_MAX_CANDIDATES"),
        "sim_actions": ("schedule-simulator actions (over the distinct pipeline simulations "
                        "of its candidates)", "PARALAB_ADVISE_MAX_SIM_ACTIONS")}


@dataclass(frozen=True)
class Budget:
    layouts: int
    candidates: int
    sim_actions: int

    def __post_init__(self):
        for name in WHAT:
            assert getattr(self, name) >= 1, f"budget {name} must be >= 1"

    def check(self, size: dict) -> None:
        """SpecError (loc cluster, type search_budget) naming every bound `size` is over, with
        its figure and how to narrow the request."""
        errors = []
        for name, (what, setting) in WHAT.items():
            bound = getattr(self, name)
            if size[name] > bound:
                figure = str(size[name]) if size["complete"] else f"more than {bound}"
                errors.append({"loc": ["cluster"], "type": "search_budget",
                               "msg": f"search too large: {figure} {what}, over the bound of "
                                      f"{bound} ({setting}); {NARROW}"})
        if errors:
            raise SpecError(errors)


def search_size(layouts, budget: Budget | None = None) -> dict:
    n = cands = actions = 0
    sims: set[tuple] = set()
    for lay, pruned in layouts:
        n += 1
        if budget is not None and n > budget.layouts:
            return {"layouts": n, "candidates": cands, "sim_actions": actions,
                    "complete": False}
        if pruned:
            continue
        cands += 1
        p, v, sched = lay["pp"], lay["virtual_stages"], lay["pp_schedule"]
        m = simulated_microbatches(sched, p, lay["microbatches"], v)
        key = (sched, p, m, v, lay["activation_checkpointing"])
        if m is not None and key not in sims:
            sims.add(key)
            actions += p * m * v * 3
    return {"layouts": n, "candidates": cands, "sim_actions": actions, "complete": True}
