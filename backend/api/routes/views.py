"""Data shaped for the dashboard's charts (filled in by issue 7)."""

from fastapi import APIRouter

router = APIRouter(tags=["views"])
