"""Archives of a user's working directory (.tar.gz / .tgz / .zip), shared by the backend (which
checks an upload before storing it) and the worker (which unpacks it for the run).

`inspect` reads every member's header without extracting and refuses, with a ValueError naming
the member and the rule: absolute paths, `..` components, NUL / control characters or a
backslash in a name, devices, fifos and other special members, a symbolic link whose target
leaves the directory (resolved from the link's own folder, through the archive's other links),
a hard link to anything but an earlier regular file of the archive (tar names it from the
archive's root), a member under a file or a link, a path given twice, encrypted zip members,
more than `max_files` members and more than `max_unpacked_bytes` in all (declared sizes; a hard
link counts its target's size again, as it is unpacked as a copy).

`unpack` inspects, then writes each member itself into an empty folder: folders are made one by
one and must be real folders (never a link), files are created O_EXCL | O_NOFOLLOW, at most
the declared size is read from each member and the bytes actually written are counted against
the limit, so a zip whose headers lie cannot fill the disk. Links are made last, so nothing is
written through one, and each must resolve inside the folder. Standard library only.
"""

from __future__ import annotations

import gzip
import os
import posixpath
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20
MAX_NAME = 4096  # bytes in a member's path
MAX_COMPONENT = 255  # bytes in one component (most file systems' limit)
MAX_LINK_HOPS = 40  # as the kernel's ELOOP bound
MAX_READ = 4 << 20  # one read from a tar stream (headers are KiBs; members are read by CHUNK)


@dataclass(frozen=True)
class Limits:
    max_files: int = 10_000
    max_unpacked_bytes: int = 1 << 30


def kind_of(path: str | os.PathLike) -> str:
    """'tar.gz' or 'zip' by the file's first bytes (its name is not trusted)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == b"\x1f\x8b":
        return "tar.gz"
    if head in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    raise ValueError("not a .tar.gz / .tgz or .zip archive (it does not start like one)")


def _clean(name: str) -> str:
    """The member's path, normalised ('./a//b/' -> 'a/b'), or a ValueError naming the rule."""
    shown = repr(name)[1:-1][:200]
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"{shown}: a NUL or control character in the member's name")
    if "\\" in name:
        raise ValueError(f"{shown}: a backslash in the member's name")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise ValueError(f"{shown}: an absolute path")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME:
        raise ValueError(f"{shown}: a path longer than {MAX_NAME} bytes")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{shown}: a '..' component (it would leave the directory)")
    if any(len(p.encode("utf-8", "surrogateescape")) > MAX_COMPONENT for p in parts):
        raise ValueError(f"{shown}: a path component longer than {MAX_COMPONENT} bytes")
    return "/".join(parts)


def _root(raw: str, name: str, kind: str) -> bool:
    """True for the directory itself ('.' or './', as `tar -C dir .` writes it: skipped); a
    ValueError for any other member without a path."""
    if name:
        return False
    if kind == "dir":
        return True
    raise ValueError(f"{raw[:200]!r}: an empty path")


class _BoundedGzip(gzip.GzipFile):
    """The decompressed tar stream, held to the limit plus room for headers, and no single
    read larger than MAX_READ: tarfile reads a long-name or pax header whole, as large as
    it declares (a few KiB of gzip could ask for gigabytes of memory)."""

    bound = 0

    def read(self, size=-1):
        if size is None or size < 0 or size > MAX_READ:
            raise ValueError(f"a tar header or read of {size} bytes (more than {MAX_READ:,})")
        if self.tell() + size > self.bound:
            raise ValueError(f"the tar stream is longer than {self.bound:,} bytes unpacked")
        return super().read(size)

    def seek(self, offset, whence=0):
        if whence == 0 and offset > self.bound:
            raise ValueError(f"the tar stream is longer than {self.bound:,} bytes unpacked")
        return super().seek(offset, whence)


@contextmanager
def _open_tar(path: Path, limits: Limits) -> Iterator[tarfile.TarFile]:
    with _BoundedGzip(path, "rb") as z:
        # every member may carry a header block and a long name or pax header: room for them
        z.bound = limits.max_unpacked_bytes + (limits.max_files + 2) * 3 * 512 + MAX_READ
        with tarfile.open(fileobj=z, mode="r:") as t:
            yield t


def _members(path: Path, kind: str, limits: Limits) -> list[dict]:
    """Every member as {path, size, type, target?, ref}: headers only (a zip link's target is
    its content, read bounded)."""
    out = []
    if kind == "zip":
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                name = _clean(info.filename)
                mode = info.external_attr >> 16
                if info.flag_bits & 0x1:
                    raise ValueError(f"{name}: an encrypted member")
                if info.is_dir() or stat.S_ISDIR(mode):
                    kind_ = "dir"
                elif stat.S_ISLNK(mode):
                    kind_ = "symlink"
                elif stat.S_IFMT(mode) == 0 or stat.S_ISREG(mode):
                    kind_ = "file"
                else:
                    raise ValueError(f"{name}: a device, fifo or socket member")
                if _root(info.filename, name, kind_):
                    continue
                m = {"path": name, "size": info.file_size if kind_ == "file" else 0,
                     "type": kind_, "mode": mode, "ref": info}
                if kind_ == "symlink":
                    if info.file_size > MAX_NAME:
                        raise ValueError(f"{name}: a link target longer than {MAX_NAME} bytes")
                    with z.open(info) as f:
                        m["target"] = f.read(MAX_NAME + 1).decode("utf-8", "surrogateescape")
                out.append(m)
        return out
    with _open_tar(path, limits) as t:
        for ti in t:
            name = _clean(ti.name)
            if ti.issparse():
                raise ValueError(f"{name}: a sparse member")
            if ti.isreg():
                kind_ = "file"
            elif ti.isdir():
                kind_ = "dir"
            elif ti.issym():
                kind_ = "symlink"
            elif ti.islnk():
                kind_ = "hardlink"
            else:
                raise ValueError(f"{name}: a device, fifo or other special member")
            if _root(ti.name, name, kind_):
                continue
            m = {"path": name, "size": ti.size if kind_ == "file" else 0, "type": kind_,
                 "mode": ti.mode, "ref": ti}
            if kind_ in ("symlink", "hardlink"):
                m["target"] = ti.linkname
            out.append(m)
    return out


def _resolve(links: dict[str, str], start: str, target: str) -> str | None:
    """Where `target`, read from folder `start`, lands after following the archive's own
    links: a path inside the directory ('' is its root), or None when it leaves it."""
    todo = [p for p in target.split("/") if p not in ("", ".")]
    parts = [p for p in start.split("/") if p]
    hops = 0
    while todo:
        p = todo.pop(0)
        if p == "..":
            if not parts:
                return None
            parts.pop()
            continue
        parts.append(p)
        here = "/".join(parts)
        if here in links:
            hops += 1
            if hops > MAX_LINK_HOPS or links[here].startswith("/"):
                return None
            parts.pop()
            todo = [q for q in links[here].split("/") if q not in ("", ".")] + todo
    return "/".join(parts)


def _check(members: list[dict], limits: Limits) -> None:
    seen: dict[str, dict] = {}
    total = 0
    for m in members:
        if m["path"] in seen and not (m["type"] == "dir" == seen[m["path"]]["type"]):
            raise ValueError(f"{m['path']}: the path appears twice in the archive")
        if m["type"] == "hardlink":
            tgt = m["target"]
            if tgt.startswith("/") or _clean_or_none(tgt) is None:
                raise ValueError(f"{m['path']}: a hard link to {tgt!r}, outside the directory")
            t = seen.get(_clean_or_none(tgt))
            if t is None or t["type"] != "file":
                raise ValueError(f"{m['path']}: a hard link to {tgt!r}, not an earlier regular "
                                 "file of the archive")
            m["size"] = t["size"]
        seen.setdefault(m["path"], m)
        total += m["size"]
        if total > limits.max_unpacked_bytes:
            raise ValueError(f"{m['path']}: the archive unpacks to more than "
                             f"{limits.max_unpacked_bytes:,} bytes")
    links = {p: m["target"] for p, m in seen.items() if m["type"] == "symlink"}
    for p, m in seen.items():
        folder = posixpath.dirname(p)
        while folder:  # nothing under a file or a link
            if folder in seen and seen[folder]["type"] != "dir":
                raise ValueError(f"{p}: under {folder!r}, which is a {seen[folder]['type']}, "
                                 "not a folder")
            folder = posixpath.dirname(folder)
        if m["type"] == "symlink":
            tgt = m["target"]
            if not tgt or "\0" in tgt or tgt.startswith("/"):
                raise ValueError(f"{p}: a symbolic link to {tgt!r}, an absolute or empty target")
            if _resolve(links, posixpath.dirname(p), tgt) is None:
                raise ValueError(f"{p}: a symbolic link to {tgt!r}, which leaves the directory")


def _clean_or_none(name: str) -> str | None:
    try:
        return _clean(name)
    except ValueError:
        return None


def _read(path: Path, limits: Limits) -> tuple[str, list[dict]]:
    kind = kind_of(path)
    try:
        members = _members(path, kind, limits)
    except ValueError:
        raise
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, RuntimeError,
            NotImplementedError) as exc:
        raise ValueError(f"not a readable {kind} archive ({exc})") from None
    if len(members) > limits.max_files:
        raise ValueError(f"{members[limits.max_files]['path']}: more than {limits.max_files:,} "
                         "members")
    _check(members, limits)
    return kind, members


def inspect(path: str | os.PathLike, limits: Limits) -> list[dict]:
    """Every member as {path, size, type: file|dir|symlink|hardlink}, or a ValueError naming
    the first member that breaks a rule, and the rule."""
    _, members = _read(Path(path), limits)
    return [{"path": m["path"], "size": m["size"], "type": m["type"]} for m in members]


def _folder(dest: Path, rel: str) -> Path:
    """dest/rel's parent, made folder by folder; each must be a real folder, not a link."""
    cur = dest
    for p in rel.split("/")[:-1]:
        cur = cur / p
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{rel}: {cur.relative_to(dest)} is not a folder")
    return cur / rel.split("/")[-1]


class _Writer:
    def __init__(self, dest: Path, limits: Limits):
        self.dest, self.limits, self.written = dest, limits, 0

    def file(self, rel: str, src, declared: int, mode: int) -> None:
        target = _folder(self.dest, rel)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                     0o755 if mode & 0o111 else 0o644)
        n = 0
        with os.fdopen(fd, "wb") as f:
            while chunk := self._read(src, rel, min(CHUNK, declared - n + 1)):
                n += len(chunk)
                self.written += len(chunk)
                if n > declared:
                    raise ValueError(f"{rel}: more bytes than its declared {declared:,}")
                if self.written > self.limits.max_unpacked_bytes:
                    raise ValueError(f"{rel}: the archive unpacks to more than "
                                     f"{self.limits.max_unpacked_bytes:,} bytes")
                f.write(chunk)

    @staticmethod
    def _read(src, rel: str, n: int) -> bytes:
        try:
            return src.read(n)
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as exc:
            raise ValueError(f"{rel}: the member could not be read ({exc})") from None

    def folder(self, rel: str) -> None:
        target = _folder(self.dest, rel)
        if not target.is_dir() or target.is_symlink():
            os.mkdir(target, 0o755)


def unpack(path: str | os.PathLike, dest: str | os.PathLike, limits: Limits) -> list[dict]:
    """Extract the archive into the empty folder `dest` (made if missing); returns what
    `inspect` returns. On any refusal what was written is removed and `dest` is left empty."""
    path, dest = Path(path), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ValueError(f"{dest}: the destination is not empty")
    dest = dest.resolve()
    kind, members = _read(path, limits)
    w = _Writer(dest, limits)
    try:
        if kind == "zip":
            with zipfile.ZipFile(path) as z:
                for m in members:
                    if m["type"] == "dir":
                        w.folder(m["path"])
                    elif m["type"] == "file":
                        with z.open(m["ref"]) as src:
                            w.file(m["path"], src, m["size"], m["mode"])
        else:
            with _open_tar(path, limits) as t:
                for m in members:
                    try:  # tarfile's own rules too, as a second opinion
                        tarfile.data_filter(m["ref"], str(dest))
                    except tarfile.FilterError as exc:
                        raise ValueError(f"{m['path']}: {exc}") from None
                    if m["type"] == "dir":
                        w.folder(m["path"])
                    elif m["type"] == "file":
                        w.file(m["path"], t.extractfile(m["ref"]), m["size"], m["mode"])
        for m in members:  # hard links as copies of their (written, regular) target
            if m["type"] == "hardlink":
                with open(dest / _clean(m["target"]), "rb") as src:
                    w.file(m["path"], src, m["size"], m["mode"])
        for m in members:  # links last: nothing was written through one
            if m["type"] == "symlink":
                link = _folder(dest, m["path"])
                os.symlink(m["target"], link)
        for m in members:
            if m["type"] == "symlink":
                real = os.path.realpath(dest / m["path"])
                if os.path.commonpath([real, str(dest)]) != str(dest):
                    raise ValueError(f"{m['path']}: a symbolic link to {m['target']!r}, which "
                                     "leaves the directory")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as exc:
        _empty(dest)
        raise ValueError(f"not a readable {kind} archive ({exc})") from None
    except BaseException:
        _empty(dest)
        raise
    return [{"path": m["path"], "size": m["size"], "type": m["type"]} for m in members]


def _empty(dest: Path) -> None:
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
