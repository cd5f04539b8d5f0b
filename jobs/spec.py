"""The job spec: the one contract shared by backend, worker and jobs.

Standard library only (no torch, no pydantic) so that the backend, the worker and every
rank import it cheaply. `parse_spec` turns a JSON-like dict into a frozen `JobSpec` or raises
`SpecError` whose `errors` name the field path and the rule that failed, in the same shape
FastAPI uses for 422 bodies (`{"loc": [...], "msg": ..., "type": ...}`).

Stored runs keep the `version` they were written with; `upgrade_spec` lifts old versions to the
current one so the history stays readable as the schema grows.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from jobs import trace_schedule as TS
from jobs.faultspec import FaultSpec, fault_cross_checks, fault_dict, parse_faults
from jobs.scriptspec import ScriptSpec, parse_script, script_checks
from jobs.scriptspec import schema as script_schema
from jobs.strategies import DP_STRATEGIES, of_parallel
from jobs.trace_schedule import LEVELS, trace_checks

SPEC_VERSION = 1
DEFAULT_MAX_WORLD_SIZE = 8

ARCHS = ("mlp", "gpt", "timed")
KINDS = ("train", "collective_bench", "compute_bench", "script")  # what a user submits
# ... and the runs the service makes itself: `import` holds profiler traces made elsewhere
# (POST /api/imports, jobs/kineto/imports.py); nothing is launched for it
IMPORT_KIND = "import"
RUN_KINDS = (*KINDS, IMPORT_KIND)
DP_MODES = ("ps", "allreduce", "ddp")
PP_PARTITIONS = ("even", "measured")
PP_SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zero-bubble", "zbv")
ENGINES = ("reference", "native")
PRECISIONS = ("fp32", "bf16")
OPTIMIZERS = ("adam", "sgd")
BACKENDS = ("auto", "gloo", "nccl")
COLLECTIVE_OPS = (
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "send_recv",
)
ALLREDUCE_ALGOS = ("builtin", "naive", "ps", "ring", "tree", "butterfly")
PS_PLACEMENTS = ("dedicated", "rank0")
DTYPES = ("float32", "bfloat16", "float16", "float64", "int32")
COMPUTE_DTYPES = ("float32", "bfloat16")

_QUEUE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9_\-]{1,32}$")


def _f(default: Any, doc: str, *, choices: tuple | None = None, ge: float | None = None,
       le: float | None = None, factory: Any = None, empty_ok: bool = False):
    """A spec field with its documentation and simple per-field rules."""
    meta = {"doc": doc, "choices": choices, "ge": ge, "le": le}
    if empty_ok:
        meta["empty_ok"] = True
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelSpec:
    arch: str = _f("mlp", "model family: plain MLP stack, small GPT, or synthetic timed layers",
                   choices=ARCHS)
    layers: int = _f(4, "number of blocks (MLP layers / transformer blocks / timed layers)",
                     ge=1, le=1024)
    hidden: int = _f(64, "hidden size", ge=1, le=65536)
    heads: int = _f(4, "attention heads (gpt)", ge=1, le=1024)
    seq_len: int = _f(16, "tokens per sample (gpt); features per sample are `hidden` (mlp)",
                      ge=1, le=65536)
    vocab: int = _f(128, "vocabulary size (gpt)", ge=2, le=1_000_000)
    dropout: float = _f(0.0, "gpt: dropout probability on the embedding output (GPT-2's "
                        "embd_pdrop), 0 <= p < 1; masks come from each rank's RNG, which a "
                        "checkpoint saves and a resume restores; 0 = none", ge=0.0, le=1.0)
    t_forward: float = _f(0.01, "timed: seconds per layer forward", ge=0.0, le=60.0)
    t_backward_input: float = _f(0.01, "timed: seconds per layer input-gradient backward",
                                 ge=0.0, le=60.0)
    t_backward_weight: float = _f(0.01, "timed: seconds per layer weight-gradient backward",
                                  ge=0.0, le=60.0)
    experts: int = _f(0, "mixture of experts (gpt): experts per MoE block replacing the dense "
                      "MLP; 0 = dense (jobs/models/moe.py)", ge=0, le=1024)
    top_k: int = _f(1, "MoE: experts each token is routed to", ge=1, le=1024)
    capacity_factor: float = _f(0.0, "MoE: expert capacity per capacity group of N tokens is "
                                "ceil(capacity_factor * N * top_k / experts) assignments, the "
                                "rest dropped (later tokens of a choice level first); 0 = no "
                                "dropping", ge=0.0, le=1024.0)
    capacity_scope: str = _f("rank", "MoE: the capacity group: 'rank' = the tokens a rank "
                             "routes per micro-batch (Switch / GShard / DeepSpeed / "
                             "Megatron-Core), 'sequence' = each sequence on its own",
                             choices=("rank", "sequence"))
    aux_loss_coef: float = _f(0.0, "MoE: weight of the Switch / GShard load-balancing loss",
                              ge=0.0, le=100.0)
    router_bias: str = _f("", "MoE: constant biases added to router logits, 'EXPERT:BIAS' "
                          "comma-separated (e.g. '0:2.5' makes expert 0 hot); '' = none",
                          empty_ok=True)
    shared_expert: bool = _f(False, "MoE: a dense MLP every token also goes through "
                             "(DeepSeek-MoE's shared expert)")


@dataclass(frozen=True)
class ParallelSpec:
    dp: int = _f(1, "data-parallel degree", ge=1, le=4096)
    tp: int = _f(1, "tensor-parallel degree", ge=1, le=4096)
    pp: int = _f(1, "pipeline-parallel degree", ge=1, le=4096)
    dp_mode: str = _f("ddp", "gradient synchronisation: parameter server (seed 001), "
                      "all-reduce after backward (seed 004) or bucketed overlapped DDP",
                      choices=DP_MODES)
    zero_stage: int = _f(0, "ZeRO stage on the DP axis (0 = replicate)", ge=0, le=3)
    sequence_parallel: bool = _f(False, "Megatron sequence parallelism (needs tp > 1)")
    vocab_parallel: bool = _f(False, "vocabulary-parallel embedding and LM head (gpt, tp > 1)")
    pp_schedule: str = _f("1f1b", "pipeline schedule", choices=PP_SCHEDULES)
    microbatches: int = _f(1, "micro-batches per step per DP replica", ge=1, le=4096)
    virtual_stages: int = _f(1, "model chunks per pipeline rank (interleaved 1F1B; 2 for zbv)",
                             ge=1, le=64)
    pp_partition: str = _f("even", "how layers are cut into pipeline stages: even by count, or "
                           "by per-layer forward + backward time measured on rank 0 before "
                           "training (embedding / head counted with the first / last layer)",
                           choices=PP_PARTITIONS)
    engine: str = _f("reference", "reference: written from the seeds with explicit collectives; "
                     "native: PyTorch's own components", choices=ENGINES)
    bucket_mb: float = _f(25.0, "DDP / ZeRO-2 gradient bucket size in MiB", ge=0.0001, le=4096)
    ep: int = _f(1, "expert-parallel degree: experts sharded over groups of ep ranks carved out "
                 "of the DP group (ep divides dp; the dp/ep groups replicate)", ge=1, le=4096)
    cp: int = _f(1, "context-parallel degree (gpt): groups of cp consecutive DP ranks share "
                 "one slice of the global batch and split its sequences (ring attention, "
                 "load-balanced causal chunks; cp divides dp; dp/cp data replicas)",
                 ge=1, le=4096)


@dataclass(frozen=True)
class TrainSpec:
    global_batch: int = _f(8, "samples per optimizer step, over all DP replicas", ge=1,
                           le=1_000_000)
    steps: int = _f(5, "optimizer steps", ge=1, le=1_000_000)
    grad_accum: int = _f(1, "gradient-accumulation rounds per step", ge=1, le=4096)
    precision: str = _f("fp32", "fp32, or bf16 compute with fp32 master weights and Adam state",
                        choices=PRECISIONS)
    fp32_grads: bool = _f(False, "bf16: keep an fp32 gradient copy (the 20Ψ memory model)")
    lr: float = _f(1e-3, "learning rate", ge=0.0, le=10.0)
    optimizer: str = _f("adam", "adam (torch.optim.Adam), or plain sgd (torch.optim.SGD, no "
                        "momentum): SGD is sensitive to a constant gradient scale, Adam is not, "
                        "so the correctness tests train with both", choices=OPTIMIZERS)
    seed: int = _f(0, "seed for initial parameters and data", ge=0, le=2**31 - 1)
    activation_checkpointing: bool = _f(False, "recompute block activations in backward")
    checkpoint_every: int = _f(0, "save a group-consistent checkpoint (model, optimizer, data "
                               "position, RNG) every this many steps with "
                               "torch.distributed.checkpoint; 0 = never", ge=0, le=1_000_000)


@dataclass(frozen=True)
class RuntimeSpec:
    backend: str = _f("auto", "process-group backend: auto = nccl with CUDA, else gloo",
                      choices=BACKENDS)
    nnodes: int = _f(1, "hosts: the run's nodes are placed on this many hosts of the queue at "
                     "once (gang placement), nproc_per_node ranks each (docs/hosts.md)",
                     ge=1, le=1024)
    nproc_per_node: int = _f(2, "ranks per host", ge=1, le=1024)
    timeout_s: float = _f(600.0, "wall-clock limit for the whole job", ge=1.0, le=7 * 86400.0)
    queue: str = _f("default", "worker queue (one per GPU host)")
    hang_timeout_s: float = _f(120.0, "no completed step and no completed collective on any "
                               "rank for this long: the run is stopped as hung, with every "
                               "rank's stack and a diagnosis; 0 = off", ge=0.0, le=86400.0)
    max_restarts: int = _f(0, "after a rank fails, torchrun restarts the job this many times, "
                           "each from the last complete checkpoint", ge=0, le=10)


@dataclass(frozen=True)
class CollectiveSpec:
    ops: tuple = _f(None, "operations to sweep", factory=lambda: ("all_reduce",))
    algorithms: tuple = _f(None, "all-reduce algorithms (builtin = the backend's own)",
                           factory=lambda: ("builtin",))
    ps_placement: str = _f("dedicated", "parameter server: extra serving rank, or rank 0",
                           choices=PS_PLACEMENTS)
    min_bytes: int = _f(1024, "smallest message (nccl-tests -b)", ge=4, le=2**34)
    max_bytes: int = _f(1 << 20, "largest message (nccl-tests -e)", ge=4, le=2**34)
    factor: int = _f(2, "size multiplier between points (nccl-tests -f)", ge=2, le=1024)
    warmup: int = _f(2, "untimed iterations per point", ge=0, le=10_000)
    iters: int = _f(5, "timed iterations per point", ge=1, le=100_000)
    dtype: str = _f("float32", "element type", choices=DTYPES)
    check: bool = _f(True, "verify every result in place")


@dataclass(frozen=True)
class ComputeSpec:
    batch: int = _f(8, "samples per timed forward + backward of one layer, per rank (gpt: "
                    "sequences of model.seq_len tokens)", ge=1, le=1_000_000)
    warmup: int = _f(3, "untimed iterations", ge=0, le=10_000)
    iters: int = _f(10, "timed iterations per rank", ge=1, le=100_000)
    dtype: str = _f("float32", "parameter and activation type", choices=COMPUTE_DTYPES)


@dataclass(frozen=True)
class ResumeSpec:
    run_id: str = _f("", "continue from a checkpoint of this earlier run ('' = start fresh)",
                     empty_ok=True)
    step: int = _f(0, "the checkpoint to continue from: steps completed when it was saved",
                   ge=0, le=1_000_000)


@dataclass(frozen=True)
class TraceSpec:
    """Bounded tracing (jobs/trace_schedule.py; docs/trace-schema.md)."""
    wait: int = _f(0, "schedule: untraced steps at the start of each cycle (torch.profiler)",
                   ge=0, le=1_000_000)
    warmup: int = _f(0, "schedule: warm-up steps after `wait`, not recorded (the profiler "
                     "discards them)", ge=0, le=1_000_000)
    active: int = _f(0, "schedule: traced steps per cycle; 0 (and no steps list) = the "
                     f"default schedule: the first {TS.DEFAULT_FIRST} steps, then "
                     f"{TS.DEFAULT_ACTIVE} in every {TS.DEFAULT_PERIOD}, at most "
                     f"{TS.DEFAULT_MAX_RECORDS:,} detailed records per rank", ge=0, le=1_000_000)
    repeat: int = _f(0, "schedule: cycles; 0 = repeat until the run ends", ge=0, le=1_000_000)
    steps: str = _f("", "explicit traced steps instead of a schedule, e.g. '0-2,10'; 'all' "
                    "traces every step ('' = use the schedule)", empty_ok=True)
    max_records: int = _f(0, "cap on detailed records per rank (a step starts traced only "
                          "below it); 0 = no cap (the default schedule's "
                          f"{TS.DEFAULT_MAX_RECORDS:,} when no schedule is set)", ge=0,
                          le=10**9)
    level: str = _f("layer", "detail of a traced step: layer (per-layer spans), block (no "
                    "per-layer spans), step (only the step span), off (no detailed records: "
                    "every step's loss and step time only)", choices=LEVELS)
    flight_entries: int = _f(2000, "flight recorder: the last collectives each rank keeps "
                             "(torch's TORCH_FR_BUFFER_SIZE; default as torch's), in torch's "
                             "dump format under flight/ (docs/faults.md)", ge=1, le=1_000_000)


@dataclass(frozen=True)
class JobSpec:
    version: int = _f(SPEC_VERSION, "spec schema version", ge=1, le=SPEC_VERSION)
    name: str = _f("run", "human-readable name")
    kind: str = _f("train", "train, a collective bandwidth sweep, a compute-rate "
                   "calibration, or the user's own script (`script`, docs/scripts.md; "
                   "`import`: profiler traces made elsewhere, made by POST /api/imports)",
                   choices=RUN_KINDS)
    model: ModelSpec = _f(None, "model", factory=ModelSpec)
    parallel: ParallelSpec = _f(None, "parallel layout", factory=ParallelSpec)
    train: TrainSpec = _f(None, "training loop", factory=TrainSpec)
    runtime: RuntimeSpec = _f(None, "launch", factory=RuntimeSpec)
    collective: CollectiveSpec = _f(None, "collective_bench settings", factory=CollectiveSpec)
    compute: ComputeSpec = _f(None, "compute_bench settings (the model shape is `model`)",
                              factory=ComputeSpec)
    faults: tuple = _f(None, "faults injected on purpose (docs/faults.md): a list of "
                       "{kind, ranks, step, ...}", factory=tuple)
    resume: ResumeSpec = _f(None, "continue an earlier run from its checkpoint",
                            factory=ResumeSpec)
    trace: TraceSpec = _f(None, "which steps are traced in detail, and how much",
                          factory=TraceSpec)
    script: ScriptSpec = _f(None, "script jobs: the user's own training script "
                            "(jobs/scriptspec.py, docs/scripts.md)", factory=ScriptSpec)

    @property
    def world_size(self) -> int:
        return self.runtime.nnodes * self.runtime.nproc_per_node

    @property
    def strategy(self) -> str:
        return derive_strategy(self)

    @property
    def tokens_per_step(self) -> int:
        if self.kind == "script":  # stated by the user; 0 = unknown
            return self.script.tokens_per_step
        return step_tokens(self.train.global_batch, self.model.arch, self.model.seq_len)

    def to_dict(self) -> dict:
        return to_dict(self)


class SpecError(ValueError):
    """Invalid spec; `errors` is a list of {loc, msg, type} like FastAPI's 422 detail."""

    def __init__(self, errors: list[dict]):
        self.errors = errors
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))


# --- presets -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Preset:
    name: str
    title: str
    overrides: dict
    native: str  # the PyTorch component the native engine maps this strategy to
    seeds: str  # where in the lecture notes it comes from


def _pre(name, title, native, seeds, **overrides):
    return Preset(name, title, overrides, native, seeds)


_DP2 = {"runtime": {"nproc_per_node": 2}}
PRESETS: dict[str, Preset] = {p.name: p for p in [
    _pre("dp-ps", "DP with a parameter server on rank 0", "(none: explicit gather/broadcast)",
         "001", parallel={"dp": 2, "dp_mode": "ps"}, **_DP2),
    _pre("dp-allreduce", "DP, all-reduce every gradient after backward",
         "torch.distributed.all_reduce", "004", parallel={"dp": 2, "dp_mode": "allreduce"}, **_DP2),
    _pre("ddp", "DDP: bucketed all-reduce overlapped with backward",
         "torch.nn.parallel.DistributedDataParallel", "001",
         parallel={"dp": 2, "dp_mode": "ddp"}, **_DP2),
    _pre("zero1", "ZeRO-1: optimizer state sharded",
         "torch.distributed.optim.ZeroRedundancyOptimizer", "000/001/004",
         parallel={"dp": 2, "zero_stage": 1}, **_DP2),
    _pre("zero2", "ZeRO-2: optimizer state and gradients sharded",
         "FSDP2 fully_shard(reshard_after_forward=False)", "000/001/004",
         parallel={"dp": 2, "zero_stage": 2}, **_DP2),
    _pre("zero3", "ZeRO-3: parameters, gradients and optimizer state sharded",
         "FSDP2 fully_shard(reshard_after_forward=True)", "000/001/004",
         parallel={"dp": 2, "zero_stage": 3}, **_DP2),
    _pre("fsdp", "FSDP (ZeRO-3 on the native engine)",
         "FSDP2 fully_shard(reshard_after_forward=True)", "000",
         parallel={"dp": 2, "zero_stage": 3, "engine": "native"}, **_DP2),
    _pre("tp", "Megatron tensor parallelism", "DTensor ColwiseParallel / RowwiseParallel",
         "000/002/004", model={"arch": "gpt"}, parallel={"tp": 2}, **_DP2),
    _pre("sp", "Megatron tensor + sequence parallelism", "DTensor SequenceParallel", "000",
         model={"arch": "gpt"}, parallel={"tp": 2, "sequence_parallel": True}, **_DP2),
    _pre("pp-gpipe", "Pipeline, GPipe schedule", "torch.distributed.pipelining.ScheduleGPipe",
         "000/002", parallel={"pp": 2, "pp_schedule": "gpipe", "microbatches": 4}, **_DP2),
    _pre("pp-1f1b", "Pipeline, 1F1B schedule", "torch.distributed.pipelining.Schedule1F1B",
         "000", parallel={"pp": 2, "pp_schedule": "1f1b", "microbatches": 4}, **_DP2),
    _pre("pp-interleaved", "Pipeline, interleaved 1F1B",
         "torch.distributed.pipelining.ScheduleInterleaved1F1B", "000",
         parallel={"pp": 2, "pp_schedule": "interleaved", "microbatches": 4,
                   "virtual_stages": 2}, **_DP2),
    _pre("pp-zb", "Pipeline, zero-bubble (split backward)",
         "torch.distributed.pipelining.ScheduleInterleavedZeroBubble", "(beyond the seeds)",
         parallel={"pp": 2, "pp_schedule": "zero-bubble", "microbatches": 4}, **_DP2),
    _pre("pp-zbv", "Pipeline, ZB-V zero-bubble (two chunks per rank in a V)",
         "torch.distributed.pipelining.ScheduleZBVZeroBubble", "(beyond the seeds)",
         parallel={"pp": 2, "pp_schedule": "zbv", "microbatches": 4, "virtual_stages": 2},
         **_DP2),
    _pre("3d", "DP x TP x PP", "DeviceMesh + FSDP2 + DTensor + pipelining", "000",
         model={"arch": "gpt"},
         parallel={"dp": 2, "tp": 2, "pp": 2, "microbatches": 2},
         train={"global_batch": 8}, runtime={"nproc_per_node": 8}),
    _pre("moe", "Mixture of experts (top-2 of 4), replicated by DDP",
         "(none: the MoE block is plain modules)", "004",
         model={"arch": "gpt", "experts": 4, "top_k": 2, "aux_loss_coef": 0.01},
         parallel={"dp": 2}, **_DP2),
    _pre("moe-ep", "Expert parallelism: experts sharded over dp, all-to-all dispatch / combine",
         "(none: reference all_to_all_single dispatch)", "004",
         model={"arch": "gpt", "experts": 4, "top_k": 2, "aux_loss_coef": 0.01},
         parallel={"dp": 2, "ep": 2}, **_DP2),
    _pre("cp", "Context parallelism: ring attention over 2 ranks, load-balanced causal split",
         "(reference ring; torch context_parallel has no CPU SDPA sharding)", "004",
         model={"arch": "gpt", "seq_len": 16}, parallel={"dp": 2, "cp": 2}, **_DP2),
    _pre("4d-moe", "DP x EP x TP x PP: attention tensor-parallel, experts over EP, pipeline",
         "(reference: all_to_all_single dispatch inside the 1F1B pipeline)", "004",
         model={"arch": "gpt", "experts": 4, "top_k": 2, "aux_loss_coef": 0.01,
                "capacity_factor": 1.0},
         parallel={"dp": 2, "ep": 2, "tp": 2, "pp": 2, "microbatches": 2},
         train={"global_batch": 8}, runtime={"nproc_per_node": 8}),
    _pre("cp-3d", "CP x TP x PP: ring attention over the DP axis of a 3D layout",
         "(reference ring inside Megatron TP and the 1F1B pipeline)", "004",
         model={"arch": "gpt", "seq_len": 16},
         parallel={"dp": 2, "cp": 2, "tp": 2, "pp": 2, "microbatches": 2},
         train={"global_batch": 8}, runtime={"nproc_per_node": 8}),
    _pre("collective-sweep", "Collective bandwidth sweep (nccl-tests style)",
         "torch.distributed collectives", "000", kind="collective_bench", **_DP2),
    _pre("compute-calibration", "Compute-rate calibration: FLOP/s of one layer's forward + "
         "backward per rank (the advisor's cluster.flops)", "torch matmul (aten::mm / addmm)",
         "(beyond the seeds)", kind="compute_bench", model={"hidden": 256},
         compute={"batch": 32}, **_DP2),
]}

# Strategies whose jobs exist. Presets outside this set are listed but refused at submit, with
# the reason, until their implementation lands.
AVAILABLE: set[str] = {*DP_STRATEGIES, "collective-sweep", "compute-calibration", "script"}
AVAILABLE |= {"tp", "sp", "pp-gpipe", "pp-1f1b", "pp-interleaved", "pp-zb", "pp-zbv", "3d",
              "ddp+tp", "ddp+sp", "zero1+tp", "zero2+tp", "fsdp+tp", "zero1+pp-1f1b",
              "dp-allreduce+pp-interleaved"}  # model parallelism (issue 4)
AVAILABLE |= {"moe", "moe-ep", "ddp+moe", "ddp+moe-ep", "dp-allreduce+moe",
              "dp-allreduce+moe-ep", "zero1+moe", "zero2+moe", "zero3+moe", "fsdp+moe",
              "zero1+moe-ep", "zero2+moe-ep", "tp+moe", "tp+moe-ep", "ddp+tp+moe",
              "ddp+tp+moe-ep", "dp-allreduce+tp+moe-ep", "zero1+tp+moe-ep",
              "zero1+tp+moe"}  # mixture of experts (issue 17)
AVAILABLE |= {"cp", "ddp+cp", "dp-allreduce+cp", "zero1+cp", "zero2+cp", "tp+cp",
              "pp-gpipe+cp", "pp-1f1b+cp", "pp-interleaved+cp", "pp-zb+cp",
              "pp-zbv+cp", "tp+pp-1f1b+cp"}  # context parallelism (issue 17)
AVAILABLE |= {"pp-1f1b+moe", "pp-gpipe+moe", "pp-1f1b+moe-ep", "ddp+pp-1f1b+moe",
              "ddp+pp-1f1b+moe-ep", "dp-allreduce+pp-gpipe+moe-ep", "3d+moe",
              "tp+pp-1f1b+moe", "3d+moe-ep"}  # mixture of experts inside a pipeline (issue 17)


def step_tokens(global_batch: int, arch: str, seq_len: int) -> int:
    """Tokens in one optimizer step: its samples, times seq_len for gpt (an MLP or timed
    sample is one token)."""
    return global_batch * (seq_len if arch == "gpt" else 1)


def derive_strategy(spec: JobSpec) -> str:
    """A short label for filtering: `ddp`, `zero2`, `tp`, `pp-1f1b`, `ddp+tp`, `3d`, ..."""
    if spec.kind == "collective_bench":
        return "collective-sweep"
    if spec.kind == "compute_bench":
        return "compute-calibration"
    if spec.kind == IMPORT_KIND:
        return "import"
    if spec.kind == "script":
        return "script"
    p = spec.parallel
    parts = []
    # dp == cp with plain DDP: no data replicas, the DDP all-reduce is CP's gradient sum
    if p.dp > 1 and not (p.cp == p.dp and p.dp_mode == "ddp" and not p.zero_stage):
        parts.append(of_parallel(p).label)
    if p.tp > 1:
        parts.append("sp" if p.sequence_parallel else "tp")
    if p.pp > 1:
        parts.append({"naive": "pp-naive", "gpipe": "pp-gpipe", "1f1b": "pp-1f1b",
                      "interleaved": "pp-interleaved", "zero-bubble": "pp-zb",
                      "zbv": "pp-zbv"}[p.pp_schedule])
    if spec.model.experts:
        parts.append("moe-ep" if p.ep > 1 else "moe")
    if p.cp > 1:
        parts.append("cp")
    if p.dp > 1 and p.tp > 1 and p.pp > 1 and p.cp == 1:
        return "+".join(["3d", *parts[3:]])  # 3d, or 3d+moe-ep (seed 004's TP + PP + EP)
    return "+".join(parts) or "single"


# --- parsing -------------------------------------------------------------------------------------

def text_problem(value: str) -> str | None:
    """The one rule for text a user sends (names, notes, tags, queries, IDs), here and in the
    API: no NUL character (PostgreSQL text cannot hold one while SQLite can, so it is refused
    on both) and no lone surrogate (not UTF-8: no database, file or JSON answer can hold it).
    Returns the rule broken, or None."""
    if "\x00" in value:
        return "must not contain NUL characters (U+0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must not contain lone surrogates (U+D800-U+DFFF): send valid Unicode"
    return None


def number_problem(value: float) -> str | None:
    """The one rule for numbers a user sends: finite (JSON has no NaN or Infinity; Python's
    parser accepts them, and a NaN passes every bound check)."""
    if not math.isfinite(value):
        return "must be a finite number (NaN and Infinity are refused)"
    return None


def _err(loc, msg, typ="value_error"):
    return {"loc": list(loc), "msg": msg, "type": typ}


def _check_scalar(value, ftype: str, loc, meta, errors) -> Any:
    if ftype == "bool":
        if not isinstance(value, bool):
            errors.append(_err(loc, "must be true or false", "bool_type"))
            return None
        return value
    if ftype == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                errors.append(_err(loc, "must be an integer", "int_type"))
                return None
    elif ftype == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append(_err(loc, "must be a number", "float_type"))
            return None
        try:
            value = float(value)
        except OverflowError:  # an integer beyond any float: as infinite as Infinity
            value = math.inf
        if problem := number_problem(value):
            errors.append(_err(loc, problem, "finite_number"))
            return None
    elif ftype == "str":
        if not isinstance(value, str):
            errors.append(_err(loc, "must be a string", "string_type"))
            return None
        if problem := text_problem(value):
            errors.append(_err(loc, problem, "string_unsafe"))
            return None
        if meta.get("empty_ok") and value == "":
            return value
        if not value.strip() or len(value) > 200:
            errors.append(_err(loc, "must be 1 to 200 characters", "string_length"))
            return None
    if meta.get("choices") and value not in meta["choices"]:
        errors.append(_err(loc, f"must be one of {', '.join(map(str, meta['choices']))}",
                           "enum"))
        return None
    if meta.get("ge") is not None and value < meta["ge"]:
        errors.append(_err(loc, f"must be >= {meta['ge']:g}", "greater_than_equal"))
        return None
    if meta.get("le") is not None and value > meta["le"]:
        errors.append(_err(loc, f"must be <= {meta['le']:g}", "less_than_equal"))
        return None
    return value


_LIST_CHOICES = {("collective", "ops"): COLLECTIVE_OPS,
                 ("collective", "algorithms"): ALLREDUCE_ALGOS}


def _parse_section(cls, data, loc, errors):
    if not isinstance(data, dict):
        errors.append(_err(loc, "must be an object", "dict_type"))
        return cls()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            errors.append(_err((*loc, key), f"unknown field; allowed: {', '.join(fields)}",
                               "extra_forbidden"))
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        value, floc = data[name], (*loc, name)
        ftype = f.type if isinstance(f.type, str) else f.type.__name__
        if ftype in ("ModelSpec", "ParallelSpec", "TrainSpec", "RuntimeSpec", "CollectiveSpec",
                     "ResumeSpec", "ComputeSpec", "TraceSpec"):
            kwargs[name] = _parse_section(globals()[ftype], value, floc, errors)
        elif cls is JobSpec and name == "faults":
            kwargs[name] = parse_faults(value, _check_scalar, errors)
        elif cls is JobSpec and name == "script":
            kwargs[name] = parse_script(value, errors)
        elif ftype == "tuple":
            choices = _LIST_CHOICES[(loc[-1] if loc else "", name)]
            if (not isinstance(value, list) or not value
                    or not all(isinstance(v, str) for v in value)):
                errors.append(_err(floc, "must be a non-empty list of strings", "list_type"))
                continue
            bad = [v for v in value if v not in choices]
            if bad:
                errors.append(_err(floc, f"unknown {bad[0]!r}; allowed: {', '.join(choices)}",
                                   "enum"))
                continue
            kwargs[name] = tuple(dict.fromkeys(value))
        else:
            parsed = _check_scalar(value, ftype, floc, f.metadata, errors)
            if parsed is not None:
                kwargs[name] = parsed
    return cls(**kwargs)


def _cross_checks(s: JobSpec, max_world_size: int) -> list[dict]:
    if s.kind == IMPORT_KIND:  # built by the import from the traces: nothing here is launched
        return []
    e: list[dict] = trace_checks(s) + _dropout_checks(s) + script_checks(s)
    m, p, t, r = s.model, s.parallel, s.train, s.runtime
    world = s.world_size
    if world > max_world_size:
        e.append(_err(("runtime", "nproc_per_node"),
                      f"world size nnodes*nproc_per_node = {world} exceeds the configured cap "
                      f"of {max_world_size}"))
    if not _QUEUE_RE.match(r.queue):
        e.append(_err(("runtime", "queue"), "must match [A-Za-z0-9_.-]{1,64}"))
    if s.faults and s.kind != "train":
        e.append(_err(("faults",), "faults are injected into train jobs only"))
    elif s.faults:
        e += fault_cross_checks(s.faults, world, s.train.steps, engine=s.parallel.engine)
    if s.resume.run_id:
        if not _RUN_ID_RE.match(s.resume.run_id):
            e.append(_err(("resume", "run_id"), "must be a run ID ([A-Za-z0-9_-]{1,32})"))
        if s.kind != "train":
            e.append(_err(("resume",), "only train jobs resume from a checkpoint"))
        if not 1 <= s.resume.step < s.train.steps:
            e.append(_err(("resume", "step"), f"resume.step = {s.resume.step} must be a saved "
                          f"step between 1 and train.steps - 1 = {s.train.steps - 1}"))
    elif s.resume.step:
        e.append(_err(("resume", "step"), "needs resume.run_id"))
    if s.kind == "script":  # the script decides its own layout: runtime and trace apply
        return e
    if s.kind == "collective_bench":
        c = s.collective
        if c.min_bytes > c.max_bytes:
            e.append(_err(("collective", "min_bytes"), "must be <= collective.max_bytes"))
        if "ps" in c.algorithms and c.ps_placement == "dedicated" and world < 3:
            e.append(_err(("collective", "ps_placement"),
                          "dedicated parameter server needs world size >= 3 "
                          "(one serving rank plus at least two workers)"))
        if "butterfly" in c.algorithms and world & (world - 1):
            e.append(_err(("collective", "algorithms"),
                          f"butterfly needs a power-of-two world size, got {world}"))
        return e
    if s.kind == "compute_bench":  # one layer on every rank: the parallel degrees do not apply
        if m.arch not in ("mlp", "gpt"):
            e.append(_err(("model", "arch"), f"compute_bench times mlp or gpt layers, not "
                          f"{m.arch!r} (timed layers sleep their configured times)"))
        if m.experts:
            e.append(_err(("model", "experts"), "compute_bench times dense layers only"))
        if m.arch == "gpt" and m.hidden % m.heads:
            e.append(_err(("model", "heads"),
                          f"heads = {m.heads} must divide model.hidden = {m.hidden}"))
        return e
    if p.dp * p.tp * p.pp != world:
        e.append(_err(("parallel",),
                      f"dp*tp*pp = {p.dp}*{p.tp}*{p.pp} = {p.dp * p.tp * p.pp} must equal "
                      f"nnodes*nproc_per_node = {world}"))
    if m.hidden % p.tp:
        e.append(_err(("parallel", "tp"), f"tp = {p.tp} must divide model.hidden = {m.hidden}"))
    if m.arch == "gpt":
        if m.heads % p.tp:
            e.append(_err(("parallel", "tp"), f"tp = {p.tp} must divide model.heads = {m.heads}"))
        if m.hidden % m.heads:
            e.append(_err(("model", "heads"),
                          f"heads = {m.heads} must divide model.hidden = {m.hidden}"))
    if p.pp_partition == "even" and m.layers % (p.pp * p.virtual_stages):
        e.append(_err(("model", "layers"),
                      f"layers = {m.layers} must be divisible by pp*virtual_stages = "
                      f"{p.pp * p.virtual_stages} (or use parallel.pp_partition 'measured')"))
    if p.pp_partition == "measured" and m.layers < p.pp * p.virtual_stages:
        e.append(_err(("model", "layers"),
                      f"layers = {m.layers} must be at least pp*virtual_stages = "
                      f"{p.pp * p.virtual_stages}"))
    cp_split = p.cp > 1 and p.dp % p.cp == 0  # cp ranks of a DP group share samples
    per = (p.dp // p.cp if cp_split else p.dp) * p.microbatches * t.grad_accum
    if t.global_batch % per:
        e.append(_err(("train", "global_batch"),
                      f"global_batch = {t.global_batch} must be divisible by "
                      f"{'(dp/cp)' if cp_split else 'dp'}*microbatches*grad_accum = {per}"))
    if p.sequence_parallel:
        if p.tp < 2:
            e.append(_err(("parallel", "sequence_parallel"), "needs parallel.tp > 1"))
        if m.seq_len % p.tp:
            e.append(_err(("model", "seq_len"),
                          f"seq_len = {m.seq_len} must be divisible by tp = {p.tp} "
                          "with sequence parallelism"))
    if p.pp_schedule == "zbv":
        if p.virtual_stages != 2:
            e.append(_err(("parallel", "virtual_stages"),
                          f"parallel.virtual_stages = {p.virtual_stages} must be 2 with "
                          "pp_schedule 'zbv' (two model chunks per rank, placed in a V)"))
    elif p.virtual_stages > 1 and p.pp_schedule != "interleaved":
        e.append(_err(("parallel", "virtual_stages"),
                      "must be 1 unless pp_schedule is 'interleaved' (or 2 with 'zbv')"))
    if p.virtual_stages > 1 and p.pp == 1:
        e.append(_err(("parallel", "virtual_stages"),
                      f"virtual_stages = {p.virtual_stages} needs parallel.pp > 1 (model chunks "
                      "are spread over pipeline ranks)"))
    if p.pp > 1:
        if p.pp_schedule == "naive" and p.microbatches != 1:
            e.append(_err(("parallel", "microbatches"),
                          "must be 1 with the naive schedule (no micro-batching)"))
        if p.pp_schedule == "interleaved" and p.microbatches % p.pp:
            e.append(_err(("parallel", "microbatches"),
                          f"microbatches = {p.microbatches} must be a multiple of pp = {p.pp} "
                          "for the interleaved schedule"))
    if p.zero_stage and p.dp_mode == "ps":
        e.append(_err(("parallel", "zero_stage"),
                      "ZeRO shards over an all-reduce group; it cannot be combined with "
                      "dp_mode 'ps'"))
    if t.fp32_grads and t.precision != "bf16":
        e.append(_err(("train", "fp32_grads"), "only applies to precision 'bf16'"))
    return e + _engine_checks(s) + _moe_checks(s) + _cp_checks(s)


def _dropout_checks(s: JobSpec) -> list[dict]:
    """model.dropout: a probability below 1, on the GPT embedding (jobs/models/gpt.py); context
    parallelism swaps that embedding for its own (jobs/parallel/context.py), without one."""
    m = s.model
    if not m.dropout:
        return []
    e: list[dict] = []
    if m.dropout >= 1:
        e.append(_err(("model", "dropout"), f"dropout = {m.dropout:g} must be < 1 (1 drops "
                      "every activation)", "less_than"))
    if m.arch != "gpt":
        e.append(_err(("model", "dropout"), "dropout needs arch 'gpt' (the GPT embedding "
                      "applies it)"))
    if s.parallel.cp > 1:
        e.append(_err(("model", "dropout"), "dropout is not applied under context "
                      "parallelism (parallel.cp > 1)"))
    return e


def _engine_checks(s: JobSpec) -> list[dict]:
    """Combinations the implementations refuse, refused here at submit with the reason."""
    e: list[dict] = []
    m, p, t = s.model, s.parallel, s.train
    mp = p.tp > 1 or p.pp > 1
    if p.tp > 1 and m.arch != "gpt":
        e.append(_err(("model", "arch"), "tensor parallelism needs arch 'gpt' (attention heads "
                      "and the transformer MLP are what Megatron splits)"))
    if p.vocab_parallel:
        if p.tp < 2 or m.arch != "gpt":
            e.append(_err(("parallel", "vocab_parallel"),
                          "needs parallel.tp > 1 and arch 'gpt'"))
        elif m.vocab % p.tp:
            e.append(_err(("model", "vocab"), f"vocab = {m.vocab} must be divisible by tp = "
                          f"{p.tp} with vocab_parallel"))
    if mp and t.precision != "fp32":
        e.append(_err(("train", "precision"), "model parallelism (tp or pp > 1) runs in fp32 "
                      "only; bf16 is available for data parallelism"))
    if p.engine == "reference" and p.dp > 1 and mp:
        if p.zero_stage == 3:
            e.append(_err(("parallel", "zero_stage"), "reference ZeRO-3 gathers parameters in "
                          "its own forward, which the model-parallel runtime bypasses; use "
                          "engine 'native' (FSDP2) with tp/pp"))
        elif p.zero_stage == 2 and p.pp > 1:
            e.append(_err(("parallel", "zero_stage"), "reference ZeRO-2 with pipeline "
                          "parallelism would reduce-scatter per micro-batch; use zero_stage "
                          "0 or 1"))
        elif p.zero_stage == 2 and p.sequence_parallel:
            e.append(_err(("parallel", "zero_stage"), "reference ZeRO-2 reduce-scatters "
                          "gradients before the sequence-parallel LayerNorm / bias gradients "
                          "are summed over tp; use zero_stage 0 or 1, or engine 'native'"))
    if p.engine == "native" and p.dp > 1:
        if p.dp_mode == "ps" and not p.zero_stage:
            e.append(_err(("parallel", "engine"), "dp_mode 'ps' has no native PyTorch "
                          "component: it runs on the reference engine only"))
        if p.zero_stage == 1 and not mp and (t.checkpoint_every or s.resume.run_id):
            e.append(_err(("train", "checkpoint_every") if t.checkpoint_every else
                          ("resume",), "native ZeRO-1 (ZeroRedundancyOptimizer) keeps each "
                          "parameter's optimizer state on its owner rank only and cannot be "
                          "checkpointed here; use engine 'reference' (docs/checkpoints.md)"))
        if t.precision == "bf16" and p.zero_stage < 2:
            e.append(_err(("train", "precision"), "on the native engine bf16 needs FSDP2 "
                          "(zero_stage 2 or 3); DistributedDataParallel and "
                          "ZeroRedundancyOptimizer run in fp32 here"))
    return e


def parse_router_bias(text: str) -> dict[int, float]:
    """'0:2.5,3:-1' -> {0: 2.5, 3: -1.0}; ValueError naming the bad item."""
    out: dict[int, float] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        e, sep, b = item.partition(":")
        try:
            expert, bias = int(e), float(b)
        except ValueError:
            raise ValueError(f"{item!r} is not EXPERT:BIAS (e.g. '0:2.5')") from None
        if not sep or not math.isfinite(bias) or expert in out:
            raise ValueError(f"{item!r} is not EXPERT:BIAS with a finite bias, once per expert")
        out[expert] = bias
    return out


def _moe_checks(s: JobSpec) -> list[dict]:
    """Mixture of experts and expert parallelism (jobs/models/moe.py, jobs/parallel/expert.py)."""
    e: list[dict] = []
    m, p, t = s.model, s.parallel, s.train
    moe_fields = ("top_k", "capacity_factor", "capacity_scope", "aux_loss_coef", "router_bias",
                  "shared_expert")
    if not m.experts:
        dflt = ModelSpec()
        e += [_err(("model", f), "needs model.experts > 0") for f in moe_fields
              if getattr(m, f) != getattr(dflt, f)]
        if p.ep > 1:
            e.append(_err(("parallel", "ep"), "expert parallelism needs model.experts > 0"))
        return e
    if m.arch != "gpt":
        e.append(_err(("model", "experts"), "mixture of experts needs arch 'gpt' (the MoE "
                      "block replaces the transformer MLP)"))
    if m.top_k > m.experts:
        e.append(_err(("model", "top_k"), f"top_k = {m.top_k} must be <= model.experts = "
                      f"{m.experts}"))
    try:
        bad = [x for x in parse_router_bias(m.router_bias) if not 0 <= x < m.experts]
        if bad:
            e.append(_err(("model", "router_bias"), f"expert {bad[0]} is outside 0.."
                          f"{m.experts - 1}"))
    except ValueError as exc:
        e.append(_err(("model", "router_bias"), str(exc)))
    if p.dp % p.ep:
        e.append(_err(("parallel", "ep"), f"ep = {p.ep} must divide dp = {p.dp} (EP groups "
                      "are carved out of the DP group; the other DP ranks replicate)"))
    if m.experts % p.ep:
        e.append(_err(("parallel", "ep"), f"ep = {p.ep} must divide model.experts = "
                      f"{m.experts} (each EP rank holds experts/ep experts)"))
    if p.tp > 1:
        # reference TP splits attention only; the MoE block runs whole on every TP rank
        if p.engine != "reference":
            e.append(_err(("parallel", "engine"), "mixture of experts with tp > 1 needs "
                          "engine 'reference' (the DTensor plan would split the dense MLP)"))
        if p.sequence_parallel or p.vocab_parallel:
            e.append(_err(("parallel", "sequence_parallel" if p.sequence_parallel else
                           "vocab_parallel"), "not with mixture of experts yet (sequence "
                          "parallelism would route partial sequences; vocabulary parallelism "
                          "is untested with it)"))
    if p.ep > 1:
        # what the reference EP wrapper (jobs/parallel/expert.py) does not compose with yet
        if p.engine != "reference":
            e.append(_err(("parallel", "engine"), "expert parallelism has no native PyTorch "
                          "component here: use engine 'reference'"))
        if p.dp_mode == "ps":
            e.append(_err(("parallel", "dp_mode"), "expert parallelism all-reduces expert "
                          "gradients over the expert-DP group; use dp_mode 'allreduce' or "
                          "'ddp' for the other parameters"))
        if p.zero_stage == 3:
            e.append(_err(("parallel", "zero_stage"), "reference ZeRO-3 gathers each block's "
                          "parameters itself and would not see the EP-sharded experts; use "
                          "zero_stage 0, 1 or 2 with ep > 1"))
        if t.precision != "fp32":
            e.append(_err(("train", "precision"), "expert parallelism runs in fp32 only"))
        if t.activation_checkpointing:
            e.append(_err(("train", "activation_checkpointing"), "recomputing an EP block "
                          "would repeat its all-to-alls in backward; not supported with ep > 1"))
        if t.checkpoint_every or s.resume.run_id:
            e.append(_err(("train", "checkpoint_every") if t.checkpoint_every else ("resume",),
                          "checkpoints of EP-sharded experts are not implemented yet"))
    return e


def _cp_checks(s: JobSpec) -> list[dict]:
    """Context parallelism (jobs/parallel/context.py) and what it does not compose with yet."""
    m, p, t = s.model, s.parallel, s.train
    if p.cp == 1:
        return []
    e: list[dict] = []
    if m.arch != "gpt":
        e.append(_err(("model", "arch"), "context parallelism needs arch 'gpt' (it splits "
                      "sequences and runs ring attention)"))
    if p.dp % p.cp:
        e.append(_err(("parallel", "cp"), f"cp = {p.cp} must divide dp = {p.dp} (CP groups "
                      "are cp consecutive DP ranks sharing one slice of the batch)"))
    if m.seq_len % (2 * p.cp):
        e.append(_err(("model", "seq_len"), f"seq_len = {m.seq_len} must be divisible by "
                      f"2*cp = {2 * p.cp} (load-balanced causal split: each CP rank holds a "
                      "head and a tail chunk)"))
    refuse = [
        (p.engine != "reference", ("parallel", "engine"), "context parallelism has no native "
         "engine here: torch.distributed.tensor.experimental.context_parallel shards only the "
         "CUDA flash / efficient SDPA kernels (on CPU: 'aten._scaled_dot_product_flash_"
         "attention_for_cpu does not have a sharding strategy registered'); use engine "
         "'reference'"),
        (p.sequence_parallel, ("parallel", "sequence_parallel"), "context parallelism does "
         "not compose with sequence parallelism yet (both split the sequence)"),
        (p.vocab_parallel, ("parallel", "vocab_parallel"), "context parallelism with "
         "vocabulary parallelism is not supported yet"),
        (m.experts > 0, ("model", "experts"), "context parallelism with mixture of experts "
         "is not supported yet (capacity is decided per whole sequence)"),
        (p.dp_mode == "ps" and not p.zero_stage, ("parallel", "dp_mode"), "context "
         "parallelism averages gradients with the all-reduce strategies; use dp_mode "
         "'allreduce' or 'ddp'"),
        (p.zero_stage == 3, ("parallel", "zero_stage"), "reference ZeRO-3 gathers each "
         "block's parameters in its own forward, which the ring attention module bypasses; "
         "use zero_stage 0, 1 or 2"),
        (t.precision != "fp32", ("train", "precision"), "context parallelism runs in fp32 "
         "only"),
        (t.activation_checkpointing, ("train", "activation_checkpointing"), "recomputing a "
         "block would repeat its ring in backward; not supported with cp > 1"),
        (bool(t.checkpoint_every or s.resume.run_id),
         ("train", "checkpoint_every") if t.checkpoint_every else ("resume",),
         "checkpoints with context parallelism are not implemented yet"),
    ]
    return e + [_err(loc, msg) for bad, loc, msg in refuse if bad]


def parse_spec(data: Any, *, max_world_size: int = DEFAULT_MAX_WORLD_SIZE,
               require_available: bool = False, imported: bool = False) -> JobSpec:
    """Validate a spec dict (or `{"preset": NAME, ...overrides}`) and return a JobSpec.
    `imported`: the spec of an import run (kind `import`), which only the import builds."""
    data = resolve_preset(data)
    errors: list[dict] = []
    if isinstance(data, dict) and "version" in data:
        data = upgrade_spec(data)
    spec = _parse_section(JobSpec, data, (), errors)
    if errors:
        raise SpecError(errors)
    if (spec.kind == IMPORT_KIND) != imported:
        raise SpecError([_err(("kind",), "an import run is created by POST /api/imports from "
                              "profiler traces made elsewhere; a submitted run's kind is one of "
                              + ", ".join(KINDS) if not imported else "must be import",
                              "enum")])
    errors = _cross_checks(spec, max_world_size)
    if not errors and require_available and spec.strategy not in AVAILABLE:
        errors.append(_err(("parallel",), f"strategy {spec.strategy!r} is not available yet "
                           f"(available: {', '.join(sorted(AVAILABLE))})", "not_available"))
    if errors:
        raise SpecError(errors)
    return spec


def resolve_preset(data: Any) -> Any:
    """`{"preset": NAME, ...overrides}` -> full dict, nested fields merged over the preset."""
    if not isinstance(data, dict) or "preset" not in data:
        return data
    data = dict(data)
    name = data.pop("preset")
    if not isinstance(name, str) or name not in PRESETS:  # a list or object: not hashable
        raise SpecError([_err(("preset",), f"unknown preset {name!r:.80}; allowed: "
                              f"{', '.join(PRESETS)}", "enum")])
    merged = copy.deepcopy(PRESETS[name].overrides)
    merged.setdefault("name", name)
    return deep_merge(merged, data)


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k),
                                                                              dict) else v
    return out


def upgrade_spec(data: dict) -> dict:
    """Lift a stored spec to SPEC_VERSION. Version 1 is the first; later versions add steps."""
    data = dict(data)
    version = data.get("version", SPEC_VERSION)
    # Only real older versions are lifted: 0, negatives and booleans stay, for parse_spec to
    # refuse (`version` must be >= 1).
    if type(version) is int and 1 <= version < SPEC_VERSION:  # pragma: no cover - no v2 yet
        data["version"] = SPEC_VERSION
    return data


def to_dict(obj) -> dict:
    def conv(v):
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, FaultSpec):
            return fault_dict(v)
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        return v
    return conv(obj)


def presets_table() -> list[dict]:
    """The documented preset table served by GET /api/presets."""
    rows = []
    for p in PRESETS.values():
        spec = parse_spec({"preset": p.name}, max_world_size=1 << 30)
        rows.append({"name": p.name, "title": p.title, "strategy": spec.strategy,
                     "native": p.native, "seeds": p.seeds, "overrides": p.overrides,
                     "available": spec.strategy in AVAILABLE, "spec": spec.to_dict()})
    return rows


def field_docs() -> dict:
    """Field -> {type, default, doc, choices, ge, le}, for the API docs and the front-end form."""
    def walk(cls, prefix):
        out = {}
        inst = cls()
        for f in dataclasses.fields(cls):
            name = f"{prefix}{f.name}"
            ftype = f.type if isinstance(f.type, str) else f.type.__name__
            if ftype.endswith("Spec"):
                out.update(walk(globals()[ftype], name + "."))
                continue
            default = getattr(inst, f.name)
            out[name] = {"type": ftype, "default": list(default) if isinstance(default, tuple)
                         else default, **{k: v for k, v in f.metadata.items() if v is not None}}
            if name == "kind":  # what a user submits (import runs come from the import)
                out[name]["choices"] = list(KINDS)
            if (prefix.rstrip("."), f.name) in _LIST_CHOICES:
                out[name]["choices"] = _LIST_CHOICES[(prefix.rstrip("."), f.name)]
        return out
    return walk(JobSpec, "")


def _fault_schema(types: dict) -> dict:
    props = {}
    for f in dataclasses.fields(FaultSpec):
        m = f.metadata
        if f.name == "ranks":
            props[f.name] = {"type": "array", "minItems": 1,
                             "items": {"type": "integer", "minimum": 0}, "description": m["doc"]}
            continue
        ftype = f.type if isinstance(f.type, str) else f.type.__name__
        prop = {"type": types[ftype], "default": f.default, "description": m["doc"]}
        if m.get("choices"):
            prop["enum"] = list(m["choices"])
        if m.get("ge") is not None:
            prop["minimum"] = m["ge"]
        if m.get("le") is not None:
            prop["maximum"] = m["le"]
        props[f.name] = prop
    return {"type": "object", "properties": props, "additionalProperties": False}


def json_schema() -> dict:
    """JSON Schema of a job spec (for OpenAPI and editors). Cross-field rules (degrees vs world
    size, divisibility) are not expressible here; the API still enforces them with 422s."""
    types = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}

    def section(cls, path) -> dict:
        props = {}
        inst = cls()
        for f in dataclasses.fields(cls):
            ftype = f.type if isinstance(f.type, str) else f.type.__name__
            if ftype == "ScriptSpec":
                props[f.name] = script_schema()
                continue
            if ftype.endswith("Spec"):
                props[f.name] = section(globals()[ftype], (*path, f.name))
                continue
            m, default = f.metadata, getattr(inst, f.name)
            if cls is JobSpec and f.name == "faults":
                props[f.name] = {"type": "array", "maxItems": 16, "default": [],
                                 "items": _fault_schema(types), "description": m["doc"]}
                continue
            if ftype == "tuple":
                prop = {"type": "array", "minItems": 1,
                        "items": {"enum": list(_LIST_CHOICES[(path[-1], f.name)])},
                        "default": list(default)}
            else:
                prop = {"type": types[ftype], "default": default}
                if m.get("choices"):
                    prop["enum"] = list(m["choices"])
                if m.get("ge") is not None:
                    prop["minimum"] = m["ge"]
                if m.get("le") is not None:
                    prop["maximum"] = m["le"]
            prop["description"] = m["doc"]
            props[f.name] = prop
        return {"type": "object", "properties": props, "additionalProperties": False,
                "description": (cls.__doc__ or "").split("\n")[0]}

    spec = section(JobSpec, ())
    meta = {"tags": {"type": "array", "items": {"type": "string", "maxLength": 64},
                     "maxItems": 20, "description": "run metadata, not part of the spec"},
            "notes": {"type": "string", "description": "run metadata (Markdown)"}}
    spec["properties"].update(meta)
    preset = {"type": "object", "required": ["preset"],
              "properties": {"preset": {"enum": list(PRESETS), "description":
                                        "a named strategy; other fields override it"}, **meta},
              "additionalProperties": True}
    return {"title": "JobSpec", "anyOf": [spec, preset]}
