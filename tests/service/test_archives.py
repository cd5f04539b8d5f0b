"""paralab_core.archives: inspect refuses each unsafe member by name and rule; unpack writes the
archive's tree exactly (compared with the folder it was made from, walked by os.walk), never
through or out of a link, and never more bytes than the limit, even when a zip's headers lie."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from paralab_core.archives import Limits, inspect, unpack

BIG = Limits(max_files=1000, max_unpacked_bytes=1 << 30)


def tree(root: Path) -> dict:
    """{relative path: bytes | ('link', target) | 'dir'}, read with lstat (links not followed)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder, name)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_bytes()
    return out


def source(tmp: Path) -> Path:
    src = tmp / "src"
    (src / "pkg" / "data").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "data" / "blob.bin").write_bytes(os.urandom(300_000))
    (src / "empty").mkdir()
    os.symlink("pkg/data/blob.bin", src / "latest")
    os.symlink("../train.py", src / "pkg" / "train_link.py")
    return src


def tar_of(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def ti(name: str, type_=tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = type_, linkname, 0o644
    return info


def zip_of(path: Path, members: list[tuple[str, bytes, int | None]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            if mode is not None:
                info.external_attr = mode << 16
            z.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    return path


def test_tar_unpack_equals_source(tmp_path):
    src = source(tmp_path)
    arc = tmp_path / "a.tar.gz"
    with tarfile.open(arc, "w:gz") as t:
        t.add(src, arcname=".")
    entries = unpack(arc, tmp_path / "out", BIG)
    assert tree(tmp_path / "out") == tree(src)
    kinds = {e["path"]: e["type"] for e in entries}
    assert kinds["latest"] == "symlink" and "" not in kinds and len(kinds) == len(entries) == 8


def test_zip_unpack_equals_source(tmp_path):
    src = source(tmp_path)
    members = []
    for rel, what in sorted(tree(src).items()):
        if what == "dir":
            members.append((rel + "/", b"", 0o40755))
        elif isinstance(what, tuple):
            members.append((rel, what[1].encode(), 0o120777))
        else:
            members.append((rel, what, 0o100644))
    entries = unpack(zip_of(tmp_path / "a.zip", members), tmp_path / "out", BIG)
    assert tree(tmp_path / "out") == tree(src)
    assert sum(e["size"] for e in entries) == 300_000 + len("print('hi')\n")


def test_tar_hardlink_inside_is_a_copy(tmp_path):
    arc = tar_of(tmp_path / "a.tgz", [(ti("a.txt"), b"abc"),
                                      (ti("sub/b.txt", tarfile.LNKTYPE, "a.txt"), None)])
    assert [e["size"] for e in inspect(arc, BIG)] == [3, 3]
    unpack(arc, tmp_path / "out", BIG)
    assert (tmp_path / "out/sub/b.txt").read_bytes() == b"abc"


@pytest.mark.parametrize("members, member, rule", [
    ([(ti("../x"), b"x")], "../x", "'..'"),
    ([(ti("a/../../x"), b"x")], "a/../../x", "'..'"),
    ([(ti("/etc/x"), b"x")], "/etc/x", "absolute"),
    ([(ti("a\x01b"), b"x")], "a\\x01b", "control"),
    ([(ti("dev", tarfile.CHRTYPE), None)], "dev", "device"),
    ([(ti("fifo", tarfile.FIFOTYPE), None)], "fifo", "fifo"),
    ([(ti("out", tarfile.SYMTYPE, "../../etc/passwd"), None)], "out", "leaves"),
    ([(ti("sub/out", tarfile.SYMTYPE, "../.."), None)], "sub/out", "leaves"),
    ([(ti("abs", tarfile.SYMTYPE, "/etc/passwd"), None)], "abs", "absolute"),
    # a chain: each link lexically inside, together out
    ([(ti("up", tarfile.SYMTYPE, "sub/.."), None), (ti("sub", tarfile.SYMTYPE, ".."), None)],
     "up", "leaves"),
    ([(ti("hl", tarfile.LNKTYPE, "../../etc/passwd"), None)], "hl", "outside"),
    ([(ti("hl", tarfile.LNKTYPE, "/etc/passwd"), None)], "hl", "outside"),
    ([(ti("link", tarfile.SYMTYPE, "sub"), None), (ti("link/x"), b"x")], "link/x", "not a folder"),
    ([(ti("a"), b"1"), (ti("a"), b"2")], "a", "twice"),
    ([(ti("./"), b"1")], "'./'", "empty path"),
])
def test_tar_refusals(tmp_path, members, member, rule):
    arc = tar_of(tmp_path / "a.tar.gz", members)
    with pytest.raises(ValueError) as exc:
        inspect(arc, BIG)
    assert str(exc.value).startswith(member) and rule in str(exc.value), str(exc.value)
    with pytest.raises(ValueError):
        unpack(arc, tmp_path / "out", BIG)
    assert list((tmp_path / "out").iterdir()) == []


def test_symlink_inside_is_allowed(tmp_path):
    arc = tar_of(tmp_path / "a.tar.gz", [(ti("sub/f"), b"x"),
                                         (ti("sub/l", tarfile.SYMTYPE, "../sub/./f"), None)])
    unpack(arc, tmp_path / "out", BIG)
    assert (tmp_path / "out/sub/l").read_bytes() == b"x"


def test_limits(tmp_path):
    arc = tar_of(tmp_path / "a.tar.gz", [(ti(f"f{i}"), b"x") for i in range(5)])
    with pytest.raises(ValueError, match="f4: more than 4 members"):
        inspect(arc, Limits(max_files=4, max_unpacked_bytes=100))
    with pytest.raises(ValueError, match="f3: the archive unpacks to more than 3 bytes"):
        inspect(arc, Limits(max_files=10, max_unpacked_bytes=3))


def test_zip_refusals(tmp_path):
    cases = [([("../x", b"x", None)], "../x"), ([("/x", b"x", None)], "/x"),
             ([("d", b"", 0o20644)], "d"),  # a character device
             ([("l", b"../../x", 0o120777)], "l"), ([("a\\..\\x", b"", None)], "a")]
    for members, member in cases:
        arc = zip_of(tmp_path / "a.zip", members)
        with pytest.raises(ValueError, match="^" + member.replace("\\", "\\\\")):
            inspect(arc, BIG)


def test_zip_bomb_declared(tmp_path):
    arc = zip_of(tmp_path / "bomb.zip", [("zeros", bytes(8 << 20), None)])
    assert arc.stat().st_size < 64 << 10
    with pytest.raises(ValueError, match="zeros: the archive unpacks to more than"):
        unpack(arc, tmp_path / "out", Limits(max_unpacked_bytes=1 << 20))
    assert list((tmp_path / "out").iterdir()) == []


def test_zip_bomb_lying_headers(tmp_path):
    """A zip whose headers declare 100 bytes for 8 MiB: no more than 100 (+1) are read."""
    arc = zip_of(tmp_path / "liar.zip", [("zeros", bytes(8 << 20), None)])
    raw = bytearray(arc.read_bytes())
    central = raw.index(b"PK\x01\x02")
    for at in (22, central + 24):  # uncompressed size: local header, central directory
        assert raw[at:at + 4] == (8 << 20).to_bytes(4, "little")
        raw[at:at + 4] = (100).to_bytes(4, "little")
    arc.write_bytes(bytes(raw))
    assert inspect(arc, BIG)[0]["size"] == 100
    with pytest.raises(ValueError, match="^zeros: (more bytes|the member could not)"):
        unpack(arc, tmp_path / "out", BIG)
    assert list((tmp_path / "out").iterdir()) == []


def test_not_an_archive_and_dest_not_empty(tmp_path):
    (tmp_path / "x.tgz").write_bytes(b"hello")
    with pytest.raises(ValueError, match="not a .tar.gz"):
        inspect(tmp_path / "x.tgz", BIG)
    (tmp_path / "y.tgz").write_bytes(b"\x1f\x8b" + os.urandom(100))
    with pytest.raises(ValueError, match="not a readable"):
        inspect(tmp_path / "y.tgz", BIG)
    arc = tar_of(tmp_path / "a.tar.gz", [(ti("f"), b"x")])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("k")
    with pytest.raises(ValueError, match="not empty"):
        unpack(arc, tmp_path / "out", BIG)
    assert (tmp_path / "out" / "keep").read_text() == "k"


def test_unpack_rechecks_links_itself(tmp_path, monkeypatch):
    """Were inspect to let a link out (its resolver broken here), unpack still refuses it:
    tarfile's data filter for a tar, the link's real path for a zip."""
    import paralab_core.archives as archives
    monkeypatch.setattr(archives, "_resolve", lambda links, start, target: "")
    arc = tar_of(tmp_path / "a.tar.gz", [(ti("l", tarfile.SYMTYPE, "../../x"), None)])
    with pytest.raises(ValueError, match="^l: .*outside the destination"):  # tarfile's words
        unpack(arc, tmp_path / "t", BIG)
    arc = zip_of(tmp_path / "a.zip", [("l", b"../../x", 0o120777)])
    with pytest.raises(ValueError, match="^l: a symbolic link to '../../x', which leaves"):
        unpack(arc, tmp_path / "z", BIG)
    assert list((tmp_path / "t").iterdir()) == list((tmp_path / "z").iterdir()) == []


def test_writer_reads_no_more_than_declared(tmp_path):
    """A member whose stream runs past its declared size (a lying header) is cut off after one
    byte more, and the limit counts the bytes written, not the headers."""
    from paralab_core.archives import _Writer
    w = _Writer(tmp_path, Limits(max_unpacked_bytes=1000))
    src = io.BytesIO(bytes(10 << 20))
    with pytest.raises(ValueError, match="^f: more bytes than its declared 100"):
        w.file("f", src, 100, 0o644)
    assert src.tell() <= 101 and (tmp_path / "f").stat().st_size <= 100
    w = _Writer(tmp_path, Limits(max_unpacked_bytes=150))
    w.file("g", io.BytesIO(bytes(100)), 100, 0o644)
    with pytest.raises(ValueError, match="^h: the archive unpacks to more than 150"):
        w.file("h", io.BytesIO(bytes(100)), 100, 0o644)


def test_tar_header_bomb_is_refused_before_it_is_read(tmp_path):
    """A GNU long-name header declaring 64 MiB (a few KiB of gzip): tarfile would read it whole
    into memory; the stream refuses the read instead."""
    import gzip
    head = bytearray(512)
    head[0:13] = b"././@LongLink"
    head[100:108] = b"0000644\0"
    head[124:136] = b"%011o\0" % (64 << 20)
    head[156:157] = b"L"
    head[257:263] = b"ustar "
    head[148:156] = b"        "
    head[148:156] = b"%06o\0 " % sum(head)
    arc = tmp_path / "h.tar.gz"
    with gzip.open(arc, "wb") as g:
        g.write(bytes(head))
        for _ in range(64):
            g.write(bytes(1 << 20))
    assert arc.stat().st_size < 1 << 20
    with pytest.raises(ValueError, match="tar header or read of 67108864 bytes"):
        inspect(arc, BIG)
