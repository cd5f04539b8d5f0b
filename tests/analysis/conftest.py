"""Real reference runs for the analysis tests, launched once per session (gloo, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.launch import run_job


def launch(out: Path, spec: dict, nproc: int) -> Path:
    return run_job(out, spec, nproc, timeout=240)


ZERO3_4 = {"preset": "zero3", "name": "analysis-zero3", "parallel": {"dp": 4},
           "runtime": {"nproc_per_node": 4}, "train": {"steps": 3}}
PP_2 = {"preset": "pp-1f1b", "name": "analysis-pp", "train": {"steps": 3}}


@pytest.fixture(scope="session")
def zero3_run(tmp_path_factory) -> Path:
    """A 4-rank ZeRO-3 run of the reference engine."""
    return launch(tmp_path_factory.mktemp("zero3"), ZERO3_4, 4)


@pytest.fixture(scope="session")
def pp_run(tmp_path_factory) -> Path:
    """A 2-rank 1F1B pipeline run of the reference engine."""
    return launch(tmp_path_factory.mktemp("pp"), PP_2, 2)
