"""Analysis of finished runs: metrics tables and trace export (filled in by issue 5)."""

from fastapi import APIRouter

router = APIRouter(prefix="/api", tags=["analysis"])
