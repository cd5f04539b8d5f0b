"""Does the advisor's ranking hold when the layouts run? (issue 18; a benchmark: measured
figures are printed, never asserted; tests/theory/test_calibration.py checks the arithmetic.)

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/advisor.py [--k 8] [--steps 8]

On the `timed` model, whose compute is known (each layer call sleeps its configured time), the
advisor ranks every layout of a 1 host x `--ranks` devices cluster. The top candidates, one per
distinct predicted step time (ZeRO stages of one layout predict the same compute and near the
same comm, so they would only add ties), are run for real, as the advisor's "launch top k"
sweep would launch them: the same spec dicts (jobs.theory.advisor.spec_of), `torchrun -m
jobs.train` on gloo. The measured figures are the analysis headline's (jobs.analysis); the
ranking re-stated with them and the error per term is jobs.theory.calibration's, the function
the sweep page uses. Prints Spearman's rank correlation of predicted against measured step time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.launch import run_job  # noqa: E402
from jobs.analysis import analyze_folder  # noqa: E402
from jobs.theory.advisor import advise  # noqa: E402
from jobs.theory.advisor_rules import terms  # noqa: E402
from jobs.theory.calibration import restate  # noqa: E402

MODEL = {"arch": "timed", "layers": 8, "hidden": 64, "t_forward": 0.004,
         "t_backward_input": 0.004, "t_backward_weight": 0.004}


def distinct(candidates: list[dict], k: int, tol: float = 0.02) -> list[dict]:
    """The first k candidates whose predicted step differs from every kept one by > tol."""
    kept: list[dict] = []
    for c in candidates:
        s = c["predicted"]["step_s"]
        if all(abs(s - o["predicted"]["step_s"]) > tol * s for o in kept):
            kept.append(c)
        if len(kept) == k:
            break
    return kept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--bandwidth", type=float, default=1.0,
                    help="GB/s of the loopback link the comm term uses (gloo on this host)")
    args = ap.parse_args()
    cluster = {"hosts": 1, "devices_per_host": args.ranks, "device_memory_bytes": 8e9,
               "intra_GBps": args.bandwidth, "inter_GBps": args.bandwidth}
    adv = advise(MODEL, args.batch, cluster, top=500)
    picked = distinct(adv["candidates"], args.k)
    print(f"timed model {MODEL}, global batch {args.batch}, 1 x {args.ranks} ranks (gloo, CPU), "
          f"{adv['counts']['fitting']} fitting layouts, {len(picked)} run, {args.steps} steps "
          "each\n")
    members = []
    with tempfile.TemporaryDirectory() as d:
        for i, c in enumerate(picked):
            spec = dict(c["spec"])
            spec["train"] = {**spec["train"], "steps": args.steps}
            out = run_job(Path(d) / f"m{i}", spec, args.ranks, timeout=900)
            head = analyze_folder(out)["headline"]
            members.append({"label": c["label"], "index": c["rank"],
                            "predicted": terms(c["predicted"]), "measured": head})
    res = restate(members)
    print("| advisor rank | layout | predicted step | measured step | error | pred. bubble | "
          "meas. bubble | meas. idle |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(res["rows"], key=lambda r: r["index"]):
        t = r["terms"]
        print(f"| {r['index']} | {r['label']} | {t['step']['predicted_s'] * 1e3:.1f} ms | "
              f"{t['step']['measured_s'] * 1e3:.1f} ms | {t['step']['error_pct']:+.1f} % | "
              f"{t['bubble']['predicted_s'] * 1e3:.1f} ms | "
              f"{(t['bubble']['measured_s'] or 0) * 1e3:.1f} ms | "
              f"{(r['idle_s'] or 0) * 1e3:.1f} ms |")
    print("\n| term | members | mean error (pred - meas) | mean abs error | mean abs error % |")
    print("|---|---|---|---|---|")
    for term, e in res["terms"].items():
        if e["members"]:
            pct = f"{e['mean_abs_error_pct']:.1f} %" if e["mean_abs_error_pct"] is not None \
                else "–"
            print(f"| {term} | {e['members']} | {e['mean_error_s'] * 1e3:+.2f} ms | "
                  f"{e['mean_abs_error_s'] * 1e3:.2f} ms | {pct} |")
    rho = res["spearman"]
    print(f"\nSpearman rank correlation, predicted vs measured step time over {res['n']} "
          f"layouts: {rho:.3f}" if rho is not None else "\nSpearman: undefined (< 3 layouts)")


if __name__ == "__main__":
    main()
