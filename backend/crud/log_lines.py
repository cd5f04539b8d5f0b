"""The rules for one log line a worker reports, the same for a one-host run's lines
(crud/runs.py append_logs) and a multi-host node's (crud/nodes.py append_node_logs): the rank
its prefix names and the time it was written."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from backend.api.schemas import INT32_MAX

_RANK_PREFIX = re.compile(r"^\[(?:default|rank)(\d+)\]:")


def rank_of(line: str) -> int | None:
    """The rank a line's prefix names, or None: a number past run_logs.rank (an INTEGER) is no
    rank any job has, and the line is kept with none (checked on the digits first: Python
    refuses to convert more than 4300 of them)."""
    m = _RANK_PREFIX.match(line)
    if m is None or len(m.group(1)) > len(str(INT32_MAX)):
        return None
    rank = int(m.group(1))
    return rank if rank <= INT32_MAX else None


def line_time(ts: str | None, now: datetime) -> tuple[datetime, str | None]:
    """When a worker says a line was written, as both databases hold it, and None; or `now`
    and why not: a time that is not ISO 8601 (Python's reading: the year 0 of the format is
    none), or falls outside the years 1-9999 once in UTC, cannot be stored, and refusing the
    line would lose it."""
    if not ts:
        return now, None
    try:
        t = datetime.fromisoformat(ts)
    except ValueError:
        return now, ("not an ISO 8601 time (YYYY-MM-DDTHH:MM:SS[.ffffff][+HH:MM], years "
                     "1-9999); the line is stored with the time it arrived")
    try:
        if t.tzinfo is not None:
            t.astimezone(UTC)
    except OverflowError:
        return now, ("outside the years 1-9999 once in UTC; the line is stored with the time "
                     "it arrived")
    return t, None
