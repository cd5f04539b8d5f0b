"""Parallel degrees -> a named device mesh (pp, dp, tp) and each rank's coordinates.

Rank layout (torchtitan order, tp innermost so TP groups are neighbouring ranks):

    rank = (pp_idx * dp + dp_idx) * tp + tp_idx

Context and expert parallelism carve their groups out of each DP group (cp and ep divide
dp), by DP index, never crossing pp or tp:

    cp   dp_idx // cp equal: cp consecutive DP ranks split the sequences of one slice
    ep   dp_idx // ep equal: ep consecutive DP ranks split the experts
    edp  dp_idx % ep equal: the dp / ep ranks holding the same experts

Degrees are validated here, once, with messages that name the rule.
"""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("pp", "dp", "tp")  # the device mesh's dims
SUB_AXES = ("cp", "ep", "edp")  # groups carved out of each DP group


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    tp: int
    pp: int
    world_size: int
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in AXES:
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.dp * self.tp * self.pp != self.world_size:
            raise ValueError(f"dp*tp*pp = {self.dp}*{self.tp}*{self.pp} = "
                             f"{self.dp * self.tp * self.pp} must equal world size "
                             f"{self.world_size}")
        for name in ("cp", "ep"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1 or self.dp % v:
                raise ValueError(f"{name} must be a positive integer dividing dp = {self.dp}, "
                                 f"got {v!r}")

    @classmethod
    def from_spec(cls, spec, world_size: int) -> ParallelDims:
        p = spec.parallel
        return cls(dp=p.dp, tp=p.tp, pp=p.pp, world_size=world_size, cp=p.cp, ep=p.ep)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.pp, self.dp, self.tp)

    def coords(self, rank: int) -> dict[str, int]:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world size {self.world_size}")
        return {"pp": rank // (self.dp * self.tp), "dp": (rank // self.tp) % self.dp,
                "tp": rank % self.tp}

    def rank_of(self, *, pp: int = 0, dp: int = 0, tp: int = 0) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def group_ranks(self, axis: str, rank: int) -> list[int]:
        """The ranks of `rank`'s group on `axis`: on a mesh axis those sharing every other
        coordinate, in axis order; on cp / ep / edp its part of that DP group."""
        if axis in SUB_AXES:
            return next(g for g in self.groups(axis) if rank in g)
        if axis not in AXES:
            raise ValueError(f"axis must be one of {AXES + SUB_AXES}, got {axis!r}")
        c = self.coords(rank)
        return [self.rank_of(**{**c, axis: i}) for i in range(getattr(self, axis))]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group of `axis`, each as its ranks in axis order. Mesh axes: ordered by their
        lowest rank; cp / ep / edp: DP group by DP group (in that order), then by index within
        it, the order every rank creates them in (torch.distributed.new_group is collective)."""
        if axis in AXES:
            return [list(g) for g in sorted({tuple(self.group_ranks(axis, r))
                                             for r in range(self.world_size)})]
        if axis not in SUB_AXES:
            raise ValueError(f"axis must be one of {AXES + SUB_AXES}, got {axis!r}")
        k = self.cp if axis == "cp" else self.ep
        if axis == "edp":
            return [g[j::k] for g in self.groups("dp") for j in range(k)]
        return [g[i * k:(i + 1) * k] for g in self.groups("dp") for i in range(self.dp // k)]

    def build_mesh(self, device_type: str = "cpu"):
        """A torch DeviceMesh with dims named pp, dp, tp (needs an initialised process group)."""
        from torch.distributed.device_mesh import init_device_mesh
        return init_device_mesh(device_type, self.shape, mesh_dim_names=AXES)
