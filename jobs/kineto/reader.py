"""Streaming reader for PyTorch profiler (Kineto) Chrome-trace files.

A Kineto trace is one JSON object per rank: top-level metadata (``schemaVersion``,
``deviceProperties``, ``distributedInfo``, ...), the ``traceEvents`` array, and sometimes
trailing keys (``traceName``, ``baseTimeNanoseconds``). Real files are hundreds of MB, so
nothing here loads a whole document: the metadata before ``traceEvents`` is read token by
token (as HTA's ``parse_metadata_ijson`` does, stopping at ``traceEvents``), and the events
are streamed one object at a time by ijson's C backend.

Every failure is a ``ValueError`` naming the file and, for a parse failure, the byte offset
in the (uncompressed) JSON text where the parser gave up.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ijson
from ijson.common import ObjectBuilder

GZIP_MAGIC = b"\x1f\x8b"
# ijson's default read size; a parse error lies within the last chunk read.
CHUNK = 64 * 1024


class _CountingReader(io.RawIOBase):
    """Byte source that counts what the parser consumed; after ``slow_from`` it hands
    out one byte per read so a parse error is raised at the exact offending byte."""

    def __init__(self, raw, slow_from: int | None = None):
        self.raw = raw
        self.pos = 0
        self.slow_from = slow_from

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n == 0:  # ijson probes the stream type with read(0)
            return self.raw.read(0)
        if self.slow_from is not None and self.pos >= self.slow_from:
            n = 1
        elif self.slow_from is not None and n > 0:
            n = min(n, self.slow_from - self.pos) or 1
        data = self.raw.read(n)
        self.pos += len(data)
        return data

    def readinto(self, b) -> int:  # pragma: no cover - ijson calls read()
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


class KinetoTraceReader:
    """One trace file. ``meta`` holds the top-level keys met before ``traceEvents``
    (``distributedInfo``, ``deviceProperties``, ``schemaVersion``, ...); ``events()``
    streams the trace events. Both raise ``ValueError`` on bad input."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise ValueError(f"{self.path}: no such trace file")
        self.gzipped = _is_gzip(self.path)
        self.meta: dict[str, Any] = self._read_head()

    @property
    def distributed_info(self) -> dict[str, Any]:
        return dict(self.meta.get("distributedInfo") or {})

    @property
    def device_properties(self) -> list[dict[str, Any]]:
        return list(self.meta.get("deviceProperties") or [])

    # -- internals ---------------------------------------------------------------------
    def _open(self, slow_from: int | None = None) -> _CountingReader:
        raw = gzip.open(self.path, "rb") if self.gzipped else open(self.path, "rb")
        return _CountingReader(raw, slow_from)

    def _fail(self, what: str, offset: int) -> ValueError:
        kind = "uncompressed JSON" if self.gzipped else "file"
        return ValueError(f"{self.path}: {what} at byte {offset} of the {kind}")

    @contextmanager
    def _parse_errors(self, src: _CountingReader, rerun) -> Iterator[None]:
        """Map decoder/parser failures inside the block to ValueError; ``rerun(src)``
        repeats the parse to pin the offset (see _locate_parse_error)."""
        try:
            yield
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise self._fail(f"truncated or corrupt gzip ({exc})", src.pos) from exc
        except (ijson.JSONError, UnicodeDecodeError) as exc:
            offset = self._locate_parse_error(rerun, src.pos)
            raise self._fail(f"invalid JSON ({str(exc).splitlines()[0]})", offset) from exc
        finally:
            src.raw.close()

    def _locate_parse_error(self, run, seen: int) -> int:
        """Re-parse feeding single bytes through the last chunk so that the parser
        stops at the offending byte; only runs after a failure."""
        src = self._open(slow_from=max(0, seen - 2 * CHUNK))
        try:
            run(src)
        except (ijson.JSONError, UnicodeDecodeError):
            return max(0, src.pos - 1)
        except Exception:  # noqa: BLE001 - fall back to the coarse offset
            return seen
        finally:
            src.raw.close()
        return seen

    def _read_head(self) -> dict[str, Any]:
        def run(src) -> dict[str, Any]:
            parser = ijson.parse(src, use_float=True)
            first = next(parser, None)
            if first is None:
                raise ValueError(f"{self.path}: empty file, not a Kineto trace")
            if first[1] != "start_map":
                raise ValueError(
                    f"{self.path}: not a Kineto trace (top level is not a JSON object)"
                )
            meta: dict[str, Any] = {}
            for prefix, event, value in parser:
                if prefix == "" and event == "end_map":
                    raise ValueError(
                        f"{self.path}: not a Kineto trace (no traceEvents array)"
                    )
                if prefix == "" and event == "map_key":
                    if value == "traceEvents":
                        return meta
                    meta[value] = _build(parser)
            raise ValueError(f"{self.path}: not a Kineto trace (no traceEvents array)")

        src = self._open()
        with self._parse_errors(src, run):
            return run(src)

    def events(self) -> Iterator[dict[str, Any]]:
        """Yield each trace event dict (numbers as int or float, as ``json`` would)."""

        def items(src):
            return ijson.items(src, "traceEvents.item", use_float=True)

        src = self._open()
        with self._parse_errors(src, lambda s: sum(1 for _ in items(s))):
            for ev in items(src):
                if not isinstance(ev, dict):
                    raise ValueError(
                        f"{self.path}: not a Kineto trace (event is {type(ev).__name__})"
                    )
                yield ev


def _build(parser) -> Any:
    """Build the value whose first token is next in ``parser`` (one metadata entry)."""
    builder = ObjectBuilder()
    depth = 0
    for _prefix, event, value in parser:
        builder.event(event, value)
        if event in ("start_map", "start_array"):
            depth += 1
        elif event in ("end_map", "end_array"):
            depth -= 1
        if depth == 0:
            return builder.value
    raise ijson.IncompleteJSONError("premature EOF")
