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
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np

# a dump with fewer tensors keeps one file per tensor
PACK_MIN_TENSORS = 64
# a tensor (all samples) at most this large goes into its group's pack
PACK_TENSOR_BYTES = 64 << 10
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed: the same dump gives the same bytes


def pack_name(first: int, last: int, members: list[str]) -> str:
    """`pack_{first layer}-{last layer}_{digest of the member names}.npz`: a resumed
    dump that packs other tensors never overwrites a pack the manifest still uses."""
    h = hashlib.sha256("\n".join(members).encode()).hexdigest()[:10]
    return f"pack_{first:04d}-{last:04d}_{h}.npz"


class PackWriter:
    """One group's pack: members appended to a temp file, renamed when the group ends."""

    def __init__(self, outdir: Path):
        self.outdir = outdir
        fd, self.tmp = tempfile.mkstemp(prefix=".tmp_", suffix=".npz", dir=outdir)
        self._fh = os.fdopen(fd, "w+b")
        self._zip = zipfile.ZipFile(self._fh, "w", zipfile.ZIP_STORED, allowZip64=True)
        self.members: list[tuple[str, int]] = []  # (member name, offset of its .npy bytes)

    def add(self, member: str, npy: bytes) -> int:
        """Appends one member's `.npy` bytes; returns where they start in the pack."""
        info = zipfile.ZipInfo(member, date_time=_ZIP_DATE)
        info.compress_type = zipfile.ZIP_STORED
        info.external_attr = 0o644 << 16
        self._zip.writestr(info, npy)
        # a seekable file gets no data descriptor: the data ends where the file does
        offset = self._fh.tell() - len(npy)
        self.members.append((member, offset))
        return offset

    def close(self, final_name: str) -> Path:
        self._zip.close()
        self._fh.close()
        final = self.outdir / final_name
        os.replace(self.tmp, final)
        return final

    def abort(self) -> None:
        try:
            self._zip.close()
        except Exception:
            pass
        try:
            self._fh.close()
        except OSError:
            pass
        try:
            os.unlink(self.tmp)
        except OSError:
            pass


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
