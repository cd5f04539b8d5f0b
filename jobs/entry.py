"""The command line every job module shares: `--spec SPEC.json --out DIR` (train jobs also
`--resume CHECKPOINT_DIR`), and the failure
report the worker reads (`DIR/error-rank{R}.txt`: the rank's exception, then its traceback)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from jobs.spec import JobSpec, parse_spec

# Set by the worker for each node it launches (worker/launch.py build_env): the host label the
# cluster page shows, and the node's index in the backend's placement.
HOST_LABEL_ENV, PLACEMENT_NODE_ENV = "PARALAB_HOST_LABEL", "PARALAB_NODE"


def host_meta() -> dict:
    """Where this rank runs, for the trace meta: the host label, torchrun's node rank
    (GROUP_RANK: with c10d rendezvous the agents' sorted order, not the placement's), the
    local rank, and the placement node of the worker that launched it."""
    env = os.environ
    meta: dict = {"hostname": env.get(HOST_LABEL_ENV) or socket.gethostname()}
    for key, name in (("node_rank", "GROUP_RANK"), ("local_rank", "LOCAL_RANK"),
                      ("placement_node", PLACEMENT_NODE_ENV)):
        if (env.get(name) or "").isdigit():
            meta[key] = int(env[name])
    return meta


def job_main(prog: str, kind: str, run: Callable[[JobSpec, Path], object],
             argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--spec", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--resume", type=Path, default=None,
                    help="a complete checkpoint step folder (OUT/checkpoints/step-NNNNNN) of an "
                    "earlier run to continue from (train jobs only; docs/checkpoints.md)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rank = os.environ.get("RANK", "0")
    try:
        spec = parse_spec(json.loads(args.spec.read_text()), max_world_size=1 << 30)
        if spec.kind != kind:
            raise ValueError(f"spec kind is {spec.kind!r}; {prog} runs {kind!r} specs")
        if args.resume is not None:
            if kind != "train":
                raise ValueError(f"--resume: only train jobs resume, not {kind!r}")
            run(spec, args.out, resume=args.resume)
        else:
            run(spec, args.out)
    except BaseException as exc:  # noqa: BLE001 - any failure is reported, then re-raised
        (args.out / f"error-rank{rank}.txt").write_text(
            f"rank {rank}: {type(exc).__name__}: {exc}\n\n{traceback.format_exc()}")
        raise
    return 0


# True in a rank started by jobs/torchrun.py's fork server (rank_main), which leaves by
# returning to the launcher: os._exit there would leave the agent waiting for its result
FORKED_RANK = False


def exit_now(code: int = 0) -> None:
    """Leave without interpreter finalization, once every output is written and closed (in a
    forked rank, SystemExit: the launcher's process ends without finalization anyway).

    Seen here (gloo, torch 2.13): a rank occasionally aborts with "terminate called without an
    active exception" while the interpreter tears down torch's C++ objects after a clean run,
    which torchrun reports as a failed job. Nothing is left to do at that point, so skip it."""
    sys.stdout.flush()
    sys.stderr.flush()
    if FORKED_RANK:
        raise SystemExit(code)
    os._exit(code)
