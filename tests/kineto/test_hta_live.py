"""Recompute the expected figures with HTA itself (skipped where HTA is not installed):
the stored hta_expected.json must be what HTA says today."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("hta", reason="holistictraceanalysis (HTA) is not installed: it is not in "
                    "the CI install (about 65 packages, jupyterlab among them); "
                    "`pip install holistictraceanalysis==0.5.0` to recompute, while "
                    "test_hta_expected.py always checks the values HTA recorded")
pytestmark = pytest.mark.filterwarnings("ignore")  # HTA warns on pandas 3 idioms

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hta_expected  # noqa: E402


def test_stored_values_are_htas():
    stored = json.loads((HERE / "hta_expected.json").read_text())
    assert hta_expected.compute_all()["sets"] == stored["sets"]
