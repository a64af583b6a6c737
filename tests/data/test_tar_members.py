"""eigtrain's tar reader yields what webdataset's tarfile-based reader yields, for every kind of tar, and reads
plain and webdataset-written shards without tarfile."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest
import webdataset as wds
from webdataset.tariterators import tar_file_iterator

from eigtrain.data import tar_members
from eigtrain.data.decode import jpeg_size
from eigtrain.data.tar_members import tar_files


class Trickle(io.RawIOBase):
    """A stream that returns at most 7 bytes per read, as a socket or pipe may."""

    def __init__(self, data: bytes):
        self.inner = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, buffer):
        data = self.inner.read(min(len(buffer), 7))
        buffer[: len(data)] = data
        return len(data)


def make_tar(members, fmt=tarfile.USTAR_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(data, str):  # a symbolic link to `data`
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    return raw


SAMPLES = [("a/0001.jpg", b"\xff\xd8" + bytes(300)), ("a/0001.cls", b"3"), ("a/0002.jpg", bytes(512)),
           ("a/0002.cls", b""), ("__meta__", b"skip"), ("x/__y__/z.txt", b"skip too")]  # fmt: skip
LONG = [("d" * 60 + "/" + "n" * 90 + ".jpg", b"long name"), ("short.cls", b"1")]


def both(raw: bytes):
    """(what webdataset's reader yields, what ours yields); each a list of members or ("error", type, members)."""

    def run(read):
        out = []
        try:
            for member in read(Trickle(raw)):
                out.append(member)
        except Exception as exn:
            return ("error", type(exn), out)
        return out

    return run(tar_file_iterator), run(tar_files)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("members", [SAMPLES, LONG, SAMPLES + [("dir", None), ("link", "a/0001.jpg")] + SAMPLES])
def test_every_tar_format_reads_as_webdataset_reads_it(fmt, members):
    if fmt == tarfile.USTAR_FORMAT and members is LONG:
        members = [(name[-100:], data) for name, data in members]  # no long names in plain ustar... but a prefix:
        members.append(("p" * 120 + "/" + "q.txt", b"prefix field"))
    theirs, ours = both(make_tar(members, fmt))
    assert ours == theirs and len(ours) >= 2


def test_a_v7_directory_and_a_gnu_header_with_a_prefix_read_as_webdataset_reads_them():
    v7 = bytearray(make_tar([("d/", b""), *SAMPLES[:2]]))  # a plain file's type flag, but its name ends in "/"
    v7[156] = 0
    v7[148:156] = b"%06o\0 " % (sum(v7[:148]) + 256 + sum(v7[156:512]))
    gnu = bytearray(make_tar(SAMPLES[:2], tarfile.GNU_FORMAT))
    gnu[345:348] = b"pre"  # tarfile prepends the prefix field whatever the magic says
    gnu[148:156] = b"%06o\0 " % (sum(gnu[:148]) + 256 + sum(gnu[156:512]))
    for case in (bytes(v7), bytes(gnu)):
        theirs, ours = both(case)
        assert ours == theirs and len(ours) == 2


def test_compressed_empty_and_endless_tars_read_as_webdataset_reads_them():
    raw = make_tar(SAMPLES)
    endless = raw[: raw.index(bytes(1024), 512 * 8)]  # no end-of-archive blocks at all
    for case in (gzip.compress(raw), b"", bytes(1024), endless, raw + b"trailing junk after the end"):
        theirs, ours = both(case)
        assert ours == theirs


def test_truncated_tars_raise_after_the_same_members():
    raw = make_tar(SAMPLES)
    for cut in (700, 1024, 1030, 1536 + 5, len(raw) - 1024 - 100):
        theirs, ours = both(raw[:cut])
        assert ours == theirs, cut
    damaged = bytearray(raw)
    damaged[1024 + 10] ^= 0xFF  # the second header's checksum fails: tarfile stops there, without an error
    pax = make_tar(SAMPLES, tarfile.PAX_FORMAT)
    for case in (bytes(damaged), pax[:1024] + bytes(512) + pax[1024:]):
        theirs, ours = both(case)
        assert ours == theirs
    theirs, ours = both(raw[: 512 + 302 + 100])  # inside the first member's padding: the member, then the error
    assert ours == theirs and ours[0] == "error" and len(ours[2]) == 1


def test_plain_and_webdataset_written_shards_never_reach_tarfile(monkeypatch, tmp_path):
    def refuse(stream):
        raise AssertionError("the plain path fell back to tarfile")
        yield

    with wds.ShardWriter(str(tmp_path / "w-%06d.tar"), maxcount=100, verbose=0) as sink:  # pax mtime headers
        for i in range(5):
            sink.write({"__key__": f"k{i:03d}", "jpg": bytes(i * 100), "cls": i})
    webdataset_raw = (tmp_path / "w-000000.tar").read_bytes()
    cases = [make_tar(SAMPLES), make_tar(SAMPLES, tarfile.GNU_FORMAT), webdataset_raw]
    expected = [list(tar_file_iterator(io.BytesIO(raw))) for raw in cases]
    monkeypatch.setattr(tar_members, "_with_tarfile", refuse)
    assert [list(tar_files(io.BytesIO(raw))) for raw in cases] == expected
    assert len(expected[2]) == 10


def test_a_pax_header_the_fast_path_does_not_read_goes_to_tarfile():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("m.txt")
        info.size, info.pax_headers = 3, {"SCHILY.xattr.user.k": "v"}
        tar.addfile(info, io.BytesIO(b"abc"))
    theirs, ours = both(buffer.getvalue())
    assert ours == theirs == [{"fname": "m.txt", "data": b"abc"}]


def test_jpeg_size_reads_the_frame_header_as_pil_does():
    from PIL import Image

    for size, options in (((37, 23), {}), ((640, 480), {"progressive": True}), ((9, 300), {"quality": 20})):
        for mode in ("RGB", "L"):
            buffer = io.BytesIO()
            exif = Image.Exif()
            exif[0x010E] = "a description before the frame header"
            Image.new(mode, size).save(buffer, format="JPEG", exif=exif.tobytes(), **options)
            assert jpeg_size(buffer.getvalue()) == (size[1], size[0])
    assert jpeg_size(b"\xff\xd8\xff\xda" + bytes(10)) is None  # scan before any frame: not read here
    assert jpeg_size(b"\xff\xd8" + b"garbage") is None
