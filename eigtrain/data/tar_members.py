"""The files of a tar stream as webdataset's `tar_file_iterator` yields them (``{"fname", "data"}``), fast for the
plain case.

Python's `tarfile` costs ~100 us of interpreter time per member (its streaming reader buffers in Python and
builds a `TarInfo` of ~20 fields), two members per sample: at 32 px that is more than decoding the image and
about half a loader worker's time (tools/bench_loader.py: tar_members_us_per_member_one_core). Shards are
almost always plain ustar (what webdataset's and eigtrain's writers produce), whose headers are read here directly, checksum verified.
Per-member pax headers (webdataset's writer adds one with the mtime to every member) are read for the path and
size. Anything else (a compressed stream, GNU long names, global or sparse pax headers, base-256 sizes, a damaged
header) goes to `tarfile` from that header on, so every tar `tarfile` reads is still read, with the same names,
members and errors (tests/data/test_tar_members.py compares the two on every kind of tar).
"""

from __future__ import annotations

import re
import tarfile
from typing import Iterator

from webdataset.tariterators import meta_prefix, meta_suffix

BLOCK = 512
SKIP_META = re.compile(r"__[^/]*__($|/)")  # webdataset's default `skip_meta`
REGULAR, DIRECTORY = (b"0", b"\0"), b"5"


def read_exact(stream, size: int) -> bytes:
    """`size` bytes, fewer only at the end of the stream (sockets and pipes return short reads)."""
    data = stream.read(size)
    if len(data) == size or not data:
        return data
    parts, got = [data], len(data)
    while got < size and (more := stream.read(size - got)):
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class _Prepended:
    """A stream that first returns `head`, then reads on from `stream` (hands a header already read to tarfile)."""

    def __init__(self, head: bytes, stream):
        self.head, self.stream = head, stream

    def read(self, size: int = -1) -> bytes:
        if not self.head:
            return self.stream.read(size)
        if size is None or size < 0:
            data, self.head = self.head + self.stream.read(), b""
            return data
        data, self.head = self.head[:size], self.head[size:]
        return data if len(data) == size else data + read_exact(self.stream, size - len(data))


def _plain_header(block: bytes) -> tuple[str, int, bytes] | None:
    """(name, size, type) of a ustar header whose fields are all plain octal and whose checksum holds; else None."""
    if block[257:262] != b"ustar" or block[124] & 0x80 or block[148] & 0x80:
        return None
    try:
        size = int(block[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        checksum = int(block[148:156].split(b"\0", 1)[0].strip(), 8)
    except ValueError:
        return None
    if checksum != sum(block[:148]) + 256 + sum(block[156:]):  # the checksum field counts as spaces
        return None
    name, kind = block[:100].split(b"\0", 1)[0], block[156:157]
    if kind == b"\0" and name.endswith(b"/"):
        kind = DIRECTORY  # old V7 tars mark a directory by its trailing slash (tarfile reads it so)
    prefix = block[345:500].split(b"\0", 1)[0]  # read whatever the magic, as tarfile does
    if prefix:
        name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape"), size, kind


def _a_header(block: bytes) -> bool:
    """Whether tarfile reads `block` as a member's header (its own test: a damaged one ends its reading)."""
    try:
        tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


def _wanted(name: str) -> bool:
    """webdataset's filter with its default arguments: no metadata files."""
    if "/" not in name and name.startswith(meta_prefix) and name.endswith(meta_suffix):
        return False
    return SKIP_META.match(name) is None


PAX, PAX_KEYS_READ = b"x", frozenset((b"path", b"size"))  # per-member pax header; the keys it may set here
PAX_KEYS_IGNORED = frozenset((b"mtime", b"atime", b"ctime", b"uid", b"gid", b"uname", b"gname", b"comment"))


def _pax_records(data: bytes) -> dict[bytes, bytes] | None:
    """The records (``LEN key=value\n``) of a pax extended header, None if any is malformed or would change
    how the member is read beyond its path and size (sparse files, charsets, links: left to tarfile)."""
    records, i = {}, 0
    while i < len(data):
        space = data.find(b" ", i)
        try:
            length = int(data[i:space])
        except ValueError:
            return None
        record = data[space + 1 : i + length]
        key, sep, value = record.partition(b"=")
        if length < 5 or not sep or not record.endswith(b"\n"):
            return None
        if key not in PAX_KEYS_READ and key not in PAX_KEYS_IGNORED:
            return None
        records[key], i = value[:-1], i + length
    return records


def tar_files(stream) -> Iterator[dict]:
    """``{"fname", "data"}`` of each regular file of the tar `stream`, in order, skipping metadata files (as
    webdataset's `tar_file_iterator` with its defaults). A truncated stream raises `tarfile.ReadError`."""
    first, pax, raw_pax = True, None, b""
    while True:
        block = read_exact(stream, BLOCK)
        if not first and not pax and (not block or block.count(0) == BLOCK):
            return  # the end-of-archive marker or the stream's end after a member (where tarfile stops too)
        header = _plain_header(block) if len(block) == BLOCK else None
        if header is None and not first and not pax and not _a_header(block):
            return  # a truncated or damaged header after a member: where tarfile stops, without an error
        first = False
        if header is None or header[2] not in (*REGULAR, DIRECTORY, PAX) or (pax is not None and header[2] == PAX):
            yield from _with_tarfile(_Prepended(raw_pax + block, stream))  # also an empty or all-zero first block
            return
        name, size, kind = header
        if pax is not None:
            name = pax[b"path"].decode("utf-8", "surrogateescape") if b"path" in pax else name
            size = int(pax[b"size"]) if b"size" in pax else size
        data = read_exact(stream, size)
        if len(data) < size:
            raise tarfile.ReadError("unexpected end of data")
        if len(read_exact(stream, -size % BLOCK)) < -size % BLOCK:
            if kind in REGULAR and _wanted(name):
                yield {"fname": name, "data": data}  # as tarfile: the member, then the error
            raise tarfile.ReadError("unexpected end of data")
        if kind == PAX:
            pax, raw_pax = _pax_records(data), block + data + bytes(-size % BLOCK)
            if pax is None:
                yield from _with_tarfile(_Prepended(raw_pax, stream))
                return
            continue
        pax, raw_pax = None, b""
        if kind in REGULAR and _wanted(name):
            yield {"fname": name, "data": data}


def _with_tarfile(stream) -> Iterator[dict]:
    from webdataset.tariterators import tar_file_iterator

    yield from tar_file_iterator(stream)
