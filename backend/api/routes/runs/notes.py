"""A run's notes rendered as HTML (Markdown, sanitised: backend/core/security.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from backend.api.deps import RunDep
from backend.core.security import render_notes

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.get("/{run_id}/notes.html", response_class=HTMLResponse)
def notes_html(run: RunDep, request: Request) -> HTMLResponse:
    """The run's notes as HTML from a Markdown subset (paragraphs, emphasis, code, http(s)
    links). Everything is escaped before markup is added; served with a CSP that forbids
    scripts, so even opened directly it cannot run anything."""
    return HTMLResponse(render_notes(run.notes), headers={
        "Content-Security-Policy": "default-src 'none'; sandbox",
        "Cache-Control": "no-store"})
