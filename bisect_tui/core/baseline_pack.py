"""Small baseline tensors of a large model, packed into one `.npz` per group.

Creating a file is the dominant cost of dumping thousands of small tensors:
0.3-0.8 ms each on an ext4 VM disk in the seconds after a large deletion,
2 of the 3 seconds of a 5,104-tensor dump, against microseconds to write
their bytes. So in a dump of at least PACK_MIN_TENSORS tensors, every tensor
of at most PACK_TENSOR_BYTES (all samples together) goes into its group's
pack; larger ones keep their own `.npy`, as every tensor of a toy model does
(below 64 tensors the files cost a few tens of milliseconds at worst; at 104
small tensors packing saves 40-50 ms of a 0.7 s bisection).

A pack is a plain uncompressed `.npz` (zip, stored), its members named like
the per-tensor files (`layer_0012_MatMul_h.npy`), so `numpy.load(pack)`
and `unzip` read it with the same clear names. The manifest entry keeps
its own `.npy` name as `member`, the pack as `file`, and `offset`, where the
member's `.npy` bytes start inside the pack: readers slice those bytes
without parsing the zip, and every slice is checked against the tensor's own
SHA-256 before it is trusted, exactly like a per-tensor file.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Callable, Optional

import numpy as np

# a dump with fewer tensors keeps one file per tensor
PACK_MIN_TENSORS = 64
# a tensor (all samples) at most this large goes into its group's pack
PACK_TENSOR_BYTES = 64 << 10


def pack_name(first: int, last: int, members: list[str]) -> str:
    """`pack_{first layer}-{last layer}_{digest of the member names}.npz`: a resumed
    dump that packs other tensors never overwrites a pack the manifest still uses."""
    h = hashlib.sha256("\n".join(members).encode()).hexdigest()[:10]
    return f"pack_{first:04d}-{last:04d}_{h}.npz"


# zip records (PKWARE APPNOTE 4.3); members are stored, never compressed
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_END64 = struct.Struct("<IQHHIIQQQQ")
_LOCATOR64 = struct.Struct("<IIQI")
_DOS_TIME, _DOS_DATE = 0, (1 << 5) | 1  # 1980-01-01 00:00:00, fixed: the same dump gives the same bytes
_MADE_BY = (3 << 8) | 45  # Unix, zip 4.5 (zip64)
_U32 = 0xFFFFFFFF
# the temp file's write buffer: members are a few hundred bytes each, and with the
# default 8 KiB one write(2) per ~8 members was a fifth of adding one
BUFFER_BYTES = 1 << 20


class PackWriter:
    """One group's pack: members appended to a temp file, renamed when the group ends.

    Written record by record here rather than through zipfile: its per-member
    bookkeeping was a tenth of a 5,104-tensor dump, for what is a 30-byte
    header before each member's bytes. Readers (numpy.load, zipfile, unzip)
    see a plain stored zip; zip64 records are added only when a pack holds
    more than 65,535 members or passes 4 GiB."""

    def __init__(self, outdir: Path):
        self.outdir = outdir
        fd, self.tmp = tempfile.mkstemp(prefix=".tmp_", suffix=".npz", dir=outdir)
        self._fh = os.fdopen(fd, "wb", buffering=BUFFER_BYTES)
        self._pos = 0
        self._central: list[tuple[bytes, int, int, int]] = []  # (name, crc, size, header offset)
        self.members: list[tuple[str, int]] = []  # (member name, offset of its .npy bytes)

    def add(self, member: str, npy: bytes) -> int:
        """Appends one member's `.npy` bytes; returns where they start in the pack."""
        return self.add_parts(member, npy, ())

    def add_parts(self, member: str, header: bytes, parts) -> int:
        """`add` of `header` followed by the bytes of each buffer in `parts` (the
        samples' own, no joined copy of them); returns where they start."""
        name = member.encode("utf-8")
        size = len(header)
        crc = zlib.crc32(header)
        for p in parts:
            size += p.nbytes
            crc = zlib.crc32(p, crc)
        if size >= _U32:
            raise ValueError(f"a packed member holds at most 4 GiB ({member}: {size} bytes)")
        flags = 0x800 if not name.isascii() else 0  # bit 11: the name is UTF-8
        local = _LOCAL.pack(0x04034B50, 20, flags, 0, _DOS_TIME, _DOS_DATE, crc, size, size, len(name), 0)
        write = self._fh.write
        if type(header) is bytes:
            write(local + name + header)
        else:  # a bytearray or memoryview handed to `add`
            write(local + name)
            write(header)
        for p in parts:
            write(p)
        offset = self._pos + len(local) + len(name)
        self._central.append((name, crc, size, self._pos))
        self._pos = offset + size
        self.members.append((member, offset))
        return offset

    def _finish(self) -> None:
        """The central directory and the end records."""
        start = self._pos
        out = bytearray()
        for name, crc, size, at in self._central:
            extra = b""
            if at >= _U32:  # zip64 extra field: the header offset in 8 bytes
                extra = struct.pack("<HHQ", 0x0001, 8, at)
            flags = 0x800 if not name.isascii() else 0
            out += _CENTRAL.pack(0x02014B50, _MADE_BY, 45 if extra else 20, flags, 0, _DOS_TIME, _DOS_DATE,
                                 crc, size, size, len(name), len(extra), 0, 0, 0, 0o644 << 16,
                                 min(at, _U32))
            out += name
            out += extra
        count, cd_size = len(self._central), len(out)
        if count > 0xFFFF or start >= _U32 or cd_size >= _U32:
            end64 = start + cd_size
            out += _END64.pack(0x06064B50, _END64.size - 12, _MADE_BY, 45, 0, 0, count, count, cd_size, start)
            out += _LOCATOR64.pack(0x07064B50, 0, end64, 1)
            out += _END.pack(0x06054B50, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF),
                             min(cd_size, _U32), min(start, _U32), 0)
        else:
            out += _END.pack(0x06054B50, 0, 0, count, count, cd_size, start, 0)
        self._fh.write(out)

    def close(self, final_name: str) -> Path:
        self._finish()
        self._fh.close()
        final = self.outdir / final_name
        os.replace(self.tmp, final)
        return final

    def abort(self) -> None:
        try:
            self._fh.close()
        except OSError:
            pass
        try:
            os.unlink(self.tmp)
        except OSError:
            pass


_LAST_READ: list = []  # [(file identity, the pack's bytes)]: the last pack a reader asked for


def read_once(identity: tuple, read: Callable[[], bytes]) -> bytes:
    """The bytes of the pack with this file identity (path, inode, size, mtime),
    `read()` only when it is not the last pack read: the tensors of one pack are
    asked for one after the other, thousands of them."""
    if not (_LAST_READ and _LAST_READ[0][0] == identity):
        _LAST_READ[:] = [(identity, read())]
    return _LAST_READ[0][1]


def npy_bytes(header: bytes, samples: list[np.ndarray]) -> bytes:
    return header + b"".join(memoryview(a.reshape(-1).view(np.uint8)) for a in samples)


def member_at(pack: bytes, offset: int) -> tuple[np.dtype, tuple, int, int]:
    """(dtype, shape, data start, data length) of the `.npy` whose bytes start at
    `offset` in a pack's contents; ValueError when they are not a whole `.npy`."""
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < len(pack):
        raise ValueError(f"offset {offset!r} is outside the pack ({len(pack)} bytes)")
    fh = io.BytesIO(memoryview(pack)[offset:offset + 65536 + 16])
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    if dtype.hasobject or fortran:
        raise ValueError("not a plain C-order numeric array")
    start = offset + fh.tell()
    length = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if start + length > len(pack):
        raise ValueError("the member's data runs past the end of the pack")
    return dtype, tuple(int(d) for d in shape), start, length


def array_at(pack: bytes, offset: int) -> np.ndarray:
    """The member's values: a read-only view of the pack's bytes, no copy."""
    dtype, shape, start, length = member_at(pack, offset)
    return np.frombuffer(pack, dtype=dtype, count=length // dtype.itemsize if dtype.itemsize else 0,
                         offset=start).reshape(shape)


def digest_at(pack: bytes, offset: int) -> tuple[str, tuple, str]:
    """SHA-256 of the member's data, its shape and dtype name (what the manifest records)."""
    dtype, shape, start, length = member_at(pack, offset)
    return hashlib.sha256(memoryview(pack)[start:start + length]).hexdigest(), shape, np.dtype(dtype).name


def is_packed(entry: dict) -> bool:
    return isinstance(entry, dict) and "member" in entry


def entry_name(entry: dict) -> Optional[str]:
    """The tensor's own `.npy` name, packed or not."""
    return entry.get("member") if is_packed(entry) else entry.get("file")
