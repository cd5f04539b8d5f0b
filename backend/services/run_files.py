"""A run's files in the formats PyTorch's own tools read, as downloads (GET /api/runs/{id}/
export?format=flight|checkpoint): the flight recorder's dumps (jobs/flight.py: torch's
format, for `python -m torch.distributed.flight_recorder.fr_trace`) and a complete
checkpoint's folder (jobs/ckpt.py: torch.distributed.checkpoint's standard layout), each a
streamed .zip of the stored files, byte for byte. Never unpickled or parsed here."""

from __future__ import annotations

import re

from backend.errors import NotFound
from backend.services.run_analysis import Download, _bad_query
from jobs.analysis.kineto_download import file_chunks, iter_zip
from jobs.ckpt_index import complete_checkpoints

_FLIGHT = re.compile(r"^flight_rank_\d+$")


def flight(ra) -> Download:
    """flight/flight_rank_{R} of every rank, in a zip whose folder fr_trace reads."""
    folder = ra.dir / "flight"
    files = sorted((p for p in folder.glob("flight_rank_*") if _FLIGHT.match(p.name)),
                   key=lambda p: int(p.name.rsplit("_", 1)[1])) if folder.is_dir() else []
    if not files:
        raise NotFound(f"run {ra.run.id} has no flight records (only train runs traced by "
                       "this version write them: flight/flight_rank_R)")
    return Download(f"paralab-{ra.run.id}.flight.zip", "application/zip",
                    iter_zip((f"flight/{p.name}", file_chunks(p)) for p in files))


def checkpoint(ra, step: int | None) -> Download:
    """The complete checkpoint at `step` (default the latest): DCP's files and COMMITTED."""
    done = complete_checkpoints(ra.dir)
    if not done:
        raise NotFound(f"run {ra.run.id} has no complete checkpoint (train.checkpoint_every "
                       "saves them; docs/checkpoints.md)")
    if step is None:
        c = done[-1]
    else:
        c = next((x for x in done if x["step"] == step), None)
        if c is None:
            raise _bad_query("step", f"run {ra.run.id} has no complete checkpoint at step "
                             f"{step} (steps: {', '.join(str(x['step']) for x in done)})")
    folder = ra.dir / "checkpoints" / c["path"].rsplit("/", 1)[-1]
    names = sorted([*c["files"], "COMMITTED"])
    return Download(f"paralab-{ra.run.id}.{folder.name}.zip", "application/zip",
                    iter_zip((f"{folder.name}/{n}", file_chunks(folder / n)) for n in names))
