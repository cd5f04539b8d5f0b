"""Parallel degrees -> a named device mesh (pp, dp, tp) and each rank's coordinates.

Rank layout (torchtitan order, tp innermost so TP groups are neighbouring ranks):

    rank = (pp_idx * dp + dp_idx) * tp + tp_idx

Degrees are validated here, once, with messages that name the rule.
"""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("pp", "dp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    tp: int
    pp: int
    world_size: int

    def __post_init__(self):
        for name in AXES:
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.dp * self.tp * self.pp != self.world_size:
            raise ValueError(f"dp*tp*pp = {self.dp}*{self.tp}*{self.pp} = "
                             f"{self.dp * self.tp * self.pp} must equal world size "
                             f"{self.world_size}")

    @classmethod
    def from_spec(cls, spec, world_size: int) -> ParallelDims:
        p = spec.parallel
        return cls(dp=p.dp, tp=p.tp, pp=p.pp, world_size=world_size)

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
        """The ranks sharing every coordinate with `rank` except `axis`, in axis order."""
        c = self.coords(rank)
        return [self.rank_of(**{**c, axis: i}) for i in range(getattr(self, axis))]

    def build_mesh(self, device_type: str = "cpu"):
        """A torch DeviceMesh with dims named pp, dp, tp (needs an initialised process group)."""
        from torch.distributed.device_mesh import init_device_mesh
        return init_device_mesh(device_type, self.shape, mesh_dim_names=AXES)
