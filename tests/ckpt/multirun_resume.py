"""Test driver: several train runs, some resumed from a checkpoint of an earlier one, in one
torchrun launch (one process group; the ~4 s launch paid once). Usage (under torchrun):

    python -m tests.ckpt.multirun_resume --specs SPECS.json --out DIR

SPECS.json is a list of [name, spec-dict, resume, env]: run `name` writes into DIR/name; `resume`
is null or a checkpoint folder relative to DIR ("short/checkpoints/step-000003"), loaded as
`jobs.train --resume` would; `env` ({} mostly) is set in os.environ for that run only (the
test-only bugs of jobs/testbug.py). A run that raises writes DIR/name/error-rank{R}.txt and the
driver goes on with the next (every rank raises alike: a refused resume is checked on all)."""

from __future__ import annotations

import argparse
import json
import os
import traceback
from pathlib import Path

import torch.distributed as dist

from jobs.entry import exit_now
from jobs.spec import parse_spec
from jobs.train import run_in_group


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    for name, data, resume, env in json.loads(args.specs.read_text()):
        out = args.out / name
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            run_in_group(parse_spec(data, max_world_size=1 << 30), out, "gloo",
                         resume=args.out / resume if resume else None)
        except Exception as exc:  # noqa: BLE001 - recorded for the test, then the next run
            out.mkdir(parents=True, exist_ok=True)
            (out / f"error-rank{os.environ.get('RANK')}.txt").write_text(
                f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_now(0)  # see jobs.entry.exit_now: no teardown abort after a clean run
