"""Pipeline parallelism: stage split (stage.py), traced point-to-point (p2p.py), a runtime that
executes the per-rank action lists of jobs/schedules.py (runtime.py), and the adapter onto
torch.distributed.pipelining (native.py)."""
