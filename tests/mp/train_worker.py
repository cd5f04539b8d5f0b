"""Worker for test_train_mp.py: several `jobs.train` runs in one torchrun launch (one process
group), each from OUT/<case>/spec.json into OUT/<case>/. argv: OUT CASE..."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from jobs.entry import exit_now
from jobs.spec import parse_spec
from jobs.train import run_in_group


def main(out: Path, cases: list[str]) -> None:
    dist.init_process_group("gloo")
    done = []
    for case in cases:
        spec = parse_spec(json.loads((out / case / "spec.json").read_text()))
        run_in_group(spec, out / case, "gloo")
        dist.barrier()
        done.append(case)
    if dist.get_rank() == 0:
        (out / "result.json").write_text(json.dumps({"done": done}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
    exit_now(0)  # see jobs.entry.exit_now: no teardown abort after a clean run
