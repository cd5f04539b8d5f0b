"""Test driver: several runs inside one torchrun launch (one process group), to keep the
number of launches (~4 s each) small. Usage (under torchrun):

    python -m tests.jobs.multirun --specs SPECS.json --out DIR

SPECS.json is a list of [name, spec-dict]; run i writes into DIR/name like `jobs.train`.
"""

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
    for name, data in json.loads(args.specs.read_text()):
        out = args.out / name
        try:
            run_in_group(parse_spec(data, max_world_size=1 << 30), out, "gloo")
        except Exception as exc:  # keep going: the test reports which run failed
            out.mkdir(parents=True, exist_ok=True)
            (out / f"error-rank{os.environ.get('RANK')}.txt").write_text(
                f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            raise
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_now(0)  # see jobs.entry.exit_now: no teardown abort after a clean run
