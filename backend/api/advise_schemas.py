"""Request body of POST /api/advise (jobs/theory/advisor.py answers it). The model is a free
dict (a preset name or ModelSpec fields) that jobs.spec validates, as for runs."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from backend.api.schemas import Input, JsonInt, SafeStr
from jobs.spec import ParallelSpec
from jobs.theory.advisor import MAX_TP

_RULES = {f.name: f.metadata for f in dataclasses.fields(ParallelSpec)}


def _degree(name: str, le: int | None = None):
    """A degree with the spec's own bounds (jobs.spec.ParallelSpec), declared in the schema:
    the bounds before JsonInt's validator (after it, or on `int | None`, pydantic writes them
    as the unknown keywords ge / le)."""
    return Annotated[int, Field(ge=_RULES[name]["ge"], le=le or _RULES[name]["le"]),
                     *JsonInt.__metadata__]


def _doc(doc: str):
    return Field(None, description=f"{doc}: only layouts with this value are searched")


class AdviseCluster(Input):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")
    hosts: JsonInt = Field(ge=1, le=1024, description="hosts")
    devices_per_host: JsonInt = Field(ge=1, le=1024, description="devices (ranks) per host")
    device_memory_bytes: float = Field(gt=0, le=1e15, description="memory of one device")
    intra_GBps: float | None = Field(None, gt=0, le=1e6, description="intra-host busbw, GB/s "
                                     "(with `queue`: default the latest collective sweep's)")
    inter_GBps: float | None = Field(None, gt=0, le=1e6, description="inter-host busbw, GB/s "
                                     "(with `queue`: default the sweep's figure)")
    flops: float | None = Field(None, gt=0, le=1e21, description="FLOP/s per device: the "
                                "compute term of gpt / mlp (timed: its configured times; with "
                                "`queue`: default its latest compute calibration's median)")


class AdviseFix(Input):
    """Degrees the search keeps fixed: a smaller search (docs/advisor.md "Bounds")."""
    model_config = ConfigDict(extra="forbid")
    tp: _degree("tp", MAX_TP) | None = _doc("tensor-parallel degree (divides the world)")
    pp: _degree("pp") | None = _doc("pipeline-parallel degree (divides the world)")
    microbatches: _degree("microbatches") | None = _doc("micro-batches per step")
    zero_stage: _degree("zero_stage") | None = _doc("ZeRO stage")
    cp: _degree("cp") | None = _doc("context-parallel degree")
    ep: _degree("ep") | None = _doc("expert-parallel degree")


class AdviseIn(Input):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")
    model: dict[str, Any] = Field(description="{'preset': NAME, ...} or ModelSpec fields")
    global_batch: JsonInt = Field(ge=1, le=1_000_000)
    cluster: AdviseCluster
    queue: SafeStr | None = Field(None, max_length=64, description="this queue's workers: "
                                  "bandwidth from its latest collective sweep, FLOP/s from its "
                                  "latest compute calibration")
    top: JsonInt = Field(20, ge=1, le=500, description="candidates returned")
    fix: AdviseFix | None = Field(None, description="degrees the search keeps fixed")
    compare_to: list[dict[str, Any]] | None = Field(
        None, max_length=16, description="layouts to place in the ranking ({tp, pp, dp, "
        "micro_batch_size, pp_schedule?, virtual_stages?, zero_stage?, "
        "activation_checkpointing?, cp?, ep?}; jobs.theory.advisor_input checks each)")
