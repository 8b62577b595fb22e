"""The baseline's `.npy` writer: each tensor streamed to its file as it is computed.

Every file is a plain `.npy` (numpy.load and any npy reader open it), written
with its SHA-256 and statistics on the way, so the dump never holds more than
the group the reference just returned, and the manifest can say what each
file must contain. Small tensors of a large dump go into one pack per group
instead (baseline_pack.py).
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from bisect_tui.core import baseline_pack
from bisect_tui.core.baseline_store import SMALL_TENSOR_BYTES, cache_written
from bisect_tui.core.stats import Scratch, empty_stats, finish_stats, finished_f32_many, update_stats


PARALLEL_BYTES = 1 << 20  # below this a thread hand-off costs more than it overlaps


def _write_all(fd: int, data) -> None:
    """os.write until every byte is written (a write may be short: signals, >2 GiB)."""
    view = memoryview(data)
    while view.nbytes:
        n = os.write(fd, view)
        view = view[n:]


def _writeback_starter():
    """Linux's sync_file_range(SYNC_FILE_RANGE_WRITE): starts writing a file's dirty
    pages to disk and returns without waiting. Started after each large write, the
    disk works while the dump goes on, and the one flush before the manifest (the
    durability point, unchanged) finds little left to do. None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
        fn.argtypes = (ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint)
        fn.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lambda fd: fn(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE; a failure only leaves it to the flush


_WRITEBACK: list = []  # [the starter or None], looked up on the first large write


def _write_large(fd: int, view: memoryview) -> None:
    _write_all(fd, view)
    if not _WRITEBACK:
        _WRITEBACK.append(_writeback_starter())
    if _WRITEBACK[0] is not None:
        _WRITEBACK[0](fd)


_HEADERS: dict[tuple, bytes] = {}  # (dtype, shape) -> header: thousands of tensors share a few shapes


def _npy_header(dtype: np.dtype, shape: tuple) -> bytes:
    """The `.npy` 1.0 header numpy.save writes for a C-order array of this dtype and shape."""
    if type(shape) is tuple:  # a dtype and a tuple of ints: the key as it is, no rebuilding
        hit = _HEADERS.get((dtype, shape))
        if hit is not None:
            return hit
    key = (np.dtype(dtype), tuple(int(d) for d in shape))
    hit = _HEADERS.get(key)
    if hit is not None:
        return hit
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    if len(_HEADERS) < 4096:
        _HEADERS[key] = buf.getvalue()
    return buf.getvalue()


_NAMES: dict[np.dtype, str] = {}  # dtype -> its name: `dtype.name` is Python code in numpy, ~3 us a call


def dtype_name(dtype: np.dtype) -> str:
    name = _NAMES.get(dtype)
    if name is None:
        name = np.dtype(dtype).name
        if len(_NAMES) < 256:
            _NAMES[dtype] = name
    return name


@dataclass
class _OpenFile:
    tmp: str
    fd: int
    sha: "hashlib._Hash"
    stats: dict
    shape: tuple
    dtype: np.dtype
    nbytes: int = 0
    kept: Optional[list] = None  # the samples of a small tensor, for the read cache
    packed: bool = False  # bound for the group's pack: the samples stay in `kept`


class _Packed:
    """A tensor bound for the group's pack: its samples (kept until the group ends,
    for its statistics and the read cache), their bytes and the digest so far.
    No file, no statistics of its own: those come with the group's (end_group),
    so the thousands of small tensors of a group cost a few objects each."""

    __slots__ = ("shape", "dtype", "sha", "kept", "views")
    packed = True

    def __init__(self, shape: tuple, dtype: np.dtype, sha, kept: list, views: list):
        self.shape, self.dtype, self.sha, self.kept, self.views = shape, dtype, sha, kept, views


class NpySink:
    """Streams each tensor into a temp `.npy` sample by sample, renames at the end.

    Plain appends (header first, then each sample's bytes, straight from the
    array's buffer) rather than a memmap: written pages belong to the page
    cache, not to this process, so the dump's resident memory stays what the
    reference returned for the current group. For a large array the write, the SHA-256
    and the statistics run at once (two threads and this one: os.write,
    hashlib and numpy let go of the GIL on large buffers), and all three are
    done before `write` returns, so no array lives longer than it did."""

    def __init__(self, outdir: Path, fnames: dict[str, str], samples: int, on_done, remember: bool = False,
                 pack: bool = False, order: Optional[dict[str, int]] = None):
        """`remember`: put each small tensor into the read cache as it is written
        (a small baseline: the probe then reads none of its files back).
        `pack`: small tensors go into one `.npz` per group (baseline_pack.py);
        `order` gives each tensor's layer index for the pack's name."""
        self.remember = remember
        self.pack = pack
        self.order = order or {}
        self._pack: Optional[baseline_pack.PackWriter] = None
        self._pending: list[tuple[str, _Packed]] = []  # ended, bound for the group's pack
        self.outdir = outdir
        self.fnames = fnames
        self.samples = samples
        self.on_done = on_done
        self._open: dict[str, _OpenFile] = {}
        self._pool: Optional[ThreadPoolExecutor] = None
        self._scratch: Optional[Scratch] = None

    def write(self, tensor: str, sample: int, array: np.ndarray) -> None:
        array = np.asarray(array, order="C")  # keeps rank 0 (ascontiguousarray makes it 1-d)
        f = self._open.get(tensor)
        if f is None and self.pack and array.nbytes * self.samples <= baseline_pack.PACK_TENSOR_BYTES:
            # the bytes through a uint8 view, as below; the pack and the statistics come at end_group
            view = memoryview(array.reshape(-1).view(np.uint8))
            self._open[tensor] = _Packed(array.shape, array.dtype, hashlib.sha256(view), [array], [view])
            return
        if f is None:
            fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=".npy", dir=self.outdir)
            f = self._open[tensor] = _OpenFile(tmp, fd, hashlib.sha256(), empty_stats(), array.shape, array.dtype)
            _write_all(fd, _npy_header(array.dtype, (self.samples, *array.shape)))
            if self.remember and array.nbytes * self.samples <= SMALL_TENSOR_BYTES:
                f.kept = []
        if array.shape != f.shape or array.dtype != f.dtype:
            raise ValueError(f"tensor {tensor} changed shape or type between samples")
        # the bytes through a uint8 view: also for dtypes the buffer protocol does not
        # know (ml_dtypes' bfloat16), rank 0 and zero size; no copy (C order above)
        view = memoryview(array.reshape(-1).view(np.uint8))
        if f.packed:  # its statistics come with the group's (end_group)
            f.sha.update(view)
            f.kept.append(array)
            f.views.append(view)
            return
        if array.nbytes < PARALLEL_BYTES:
            _write_all(f.fd, view)
            f.sha.update(view)
            update_stats(f.stats, array)
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="baseline-dump")
                self._scratch = Scratch()
            wrote = self._pool.submit(_write_large, f.fd, view)
            hashed = self._pool.submit(f.sha.update, view)
            try:
                update_stats(f.stats, array, self._scratch)
            finally:  # the threads read `array`: both finish before it may go
                wait((wrote, hashed))
            wrote.result()
            hashed.result()
        f.nbytes += array.nbytes
        if f.kept is not None:
            f.kept.append(array)

    def end(self, tensor: str) -> None:
        f = self._open.pop(tensor)
        if f.packed:
            self._pending.append((tensor, f))
            return  # written into the pack, and done, when the group ends (end_group)
        meta = {
            "shape": list(f.shape),
            "dtype": dtype_name(f.dtype),
            "bytes": int(f.nbytes),
            "sha256": f.sha.hexdigest(),
            "stats": finish_stats(f.stats),
        }
        # no fsync per tensor (it was a fifth of a 5,000-tensor dump): the files are
        # flushed to disk together before the manifest, written last, marks the dump
        # complete, and every reused file is checked against its digest anyway
        os.close(f.fd)
        final = self.outdir / self.fnames[tensor]
        os.replace(f.tmp, final)
        if f.kept is not None and len(f.kept) == self.samples:
            cache_written(final, np.stack(f.kept))
        self.on_done(tensor, meta)

    def end_group(self) -> None:
        """The group's pack goes into place; only then are its tensors done (so a
        partial manifest never names a pack that is not there).

        The whole pack is written here, member after member in the order the
        tensors ended, from the samples' own buffers (no joined copy per member);
        a header and a dtype name are looked up once per kind of tensor, not per
        tensor: with 21,000 small tensors a group, per-tensor overheads were most
        of the dump's own CPU."""
        if not self._pending:
            return
        pack = self._pack = baseline_pack.PackWriter(self.outdir)
        samples, fnames, remember = self.samples, self.fnames, self.remember
        kinds: dict[tuple, tuple[bytes, str]] = {}
        offsets, cached, idx, dnames = [], [], [], []
        order_get = self.order.get
        for tensor, f in self._pending:
            kind = kinds.get((f.dtype, f.shape))
            if kind is None:
                kind = kinds[(f.dtype, f.shape)] = (_npy_header(f.dtype, (samples, *f.shape)), dtype_name(f.dtype))
            offsets.append(pack.add_parts(fnames[tensor], kind[0], f.views))
            dnames.append(kind[1])
            cached.append(_stacked(f.kept) if remember and len(f.kept) == samples else None)
            idx.append(order_get(tensor, 0))
        members = [m for m, _ in pack.members]
        name = baseline_pack.pack_name(min(idx), max(idx), members)
        final = pack.close(name)
        self._pack = None
        pending, self._pending = self._pending, []
        batched = finished_f32_many([f.kept for _, f in pending])
        try:
            pack_stat = os.lstat(final) if remember else None
        except OSError:
            pack_stat = None
        for (tensor, f), offset, kept, dname, stats in zip(pending, offsets, cached, dnames, batched):
            if stats is None:  # not float32, or NaN/Inf in it: the per-tensor statistics
                acc = empty_stats()
                for a in f.kept:
                    update_stats(acc, a)
                stats = finish_stats(acc)
            if kept is not None and pack_stat is not None:
                cache_written(final, kept, offset, pack_stat)
            self.on_done(tensor, {
                "shape": list(f.shape),
                "dtype": dname,
                "bytes": f.kept[0].nbytes * len(f.kept),  # every sample has the first one's shape and type
                "sha256": f.sha.hexdigest(),
                "stats": stats,
                "file": name,
                "member": fnames[tensor],
                "offset": offset,
            })

    def abort(self) -> None:
        """Remove unfinished temp files and stop the threads (also after a normal end)."""
        if self._pack is not None:
            self._pack.abort()
            self._pack = None
        self._pending = []
        for f in self._open.values():
            if f.packed:
                continue
            try:
                os.close(f.fd)
            except OSError:
                pass
            try:
                os.unlink(f.tmp)
            except OSError:
                pass
        self._open.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._scratch = None



def _stacked(samples: list[np.ndarray]) -> np.ndarray:
    """`np.stack(samples)` (a new C-order array, samples first) without its per-call
    checks: one small tensor's copy for the read cache, thousands per group."""
    if len(samples) == 1:
        return samples[0][np.newaxis].copy()
    out = np.empty((len(samples), *samples[0].shape), samples[0].dtype)
    for i, a in enumerate(samples):
        out[i] = a
    return out


def flush_to_disk(folder: Optional[Path] = None) -> None:
    """One flush for the whole dump instead of an fsync per tensor file.

    Linux's syncfs flushes only the file system holding the dump, so a triage on
    a shared GPU box never waits on other people's writes; elsewhere os.sync."""
    if folder is not None and sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                if libc.syncfs(fd) == 0:
                    return
            finally:
                os.close(fd)
        except (OSError, AttributeError):
            pass
    sync = getattr(os, "sync", None)
    if sync is not None:
        sync()
