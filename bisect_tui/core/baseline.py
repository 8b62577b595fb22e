"""The FP32 baseline: every intermediate tensor of the unfused model, on disk.

ORT_DISABLE_ALL, CPU, FP32, every top-level tensor marked (in memory-bounded
groups, see runner.py). One `.npy` per tensor, named
`layer_{index:04d}_{op}_{tensor}.npy` where index is the producing node's
topological position, with a leading samples axis (in a model with thousands
of tensors the small ones are members of one `.npz` per group under the same
names, see baseline_pack.py). `manifest.json` is written last;
`manifest.partial.json` after each group lets an interrupted dump resume.
"""

from __future__ import annotations

import hashlib
import io
import os
import platform
import stat
import sys
import tempfile
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import onnx

from bisect_tui import __version__
from bisect_tui.core import atomic, baseline_pack, safepath
from bisect_tui.core.cancel import CancelToken, Progress, ProgressFn, no_progress
from bisect_tui.core.graph import safe_name
from bisect_tui.core.inputs import InputSet
from bisect_tui.core.model import ModelInfo
from bisect_tui.core.runner import (
    MB,
    model_sizes,
    plan_groups,
    run_groups,
)
from bisect_tui.core.session import Session, now_iso, stable_key
from bisect_tui.core.stats import Scratch, empty_stats, finish_stats, finished_f32_many, update_stats


def inputs_sha(inputs: InputSet) -> str:
    h = hashlib.sha256()
    for name in sorted(inputs.arrays):
        a = np.ascontiguousarray(inputs.arrays[name])
        h.update(name.encode())
        h.update(a.dtype.str.encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def versions() -> dict:
    import onnxruntime as ort

    try:
        import psutil

        mem = psutil.virtual_memory().total
    except Exception:
        mem = None
    return {
        "bisect_tui": __version__,
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": mem,
    }


def file_names(info: ModelInfo, tensors: list[str]) -> dict[str, str]:
    """`layer_{index:04d}_{op}_{tensor}.npy`, unique even after making names safe."""
    names: dict[str, str] = {}
    used: set[str] = set()
    for t in tensors:
        node = info.index.by_name[info.index.producer[t]]
        idx = info.index.order[node.name]
        base = f"layer_{idx:04d}_{safe_name(node.op_type, 24)}_{safe_name(t)}"
        fname = base + ".npy"
        k = 1
        # compared case-folded: on macOS/Windows `A` and `a` are one file
        while fname.lower() in used:
            fname = f"{base}_{k}.npy"
            k += 1
        used.add(fname.lower())
        names[t] = fname
    return names


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


class _NpySink:
    """Streams each tensor into a temp `.npy` sample by sample, renames at the end.

    Plain appends (header first, then each sample's bytes, straight from the
    array's buffer) rather than a memmap: written pages belong to the page
    cache, not to this process, so the dump's resident memory stays what ORT
    returned for the current group. For a large array the write, the SHA-256
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
        self._pending: list[tuple[str, dict, int, Optional[np.ndarray], list[np.ndarray]]] = []
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
            f = self._open[tensor] = _OpenFile("", -1, hashlib.sha256(), empty_stats(), array.shape, array.dtype,
                                               kept=[], packed=True)
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
            f.nbytes += array.nbytes
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
        meta = {
            "shape": list(f.shape),
            "dtype": np.dtype(f.dtype).name,
            "bytes": int(f.nbytes),
            "sha256": f.sha.hexdigest(),
            "stats": None if f.packed else finish_stats(f.stats),
        }
        if f.packed:
            if self._pack is None:
                self._pack = baseline_pack.PackWriter(self.outdir)
            header = _npy_header(f.dtype, (self.samples, *f.shape))
            offset = self._pack.add(self.fnames[tensor], baseline_pack.npy_bytes(header, f.kept))
            kept = np.stack(f.kept) if self.remember and len(f.kept) == self.samples else None
            self._pending.append((tensor, meta, offset, kept, f.kept))
            return  # done when the pack is in place (end_group)
        # no fsync per tensor (it was a fifth of a 5,000-tensor dump): the files are
        # flushed to disk together before the manifest, written last, marks the dump
        # complete, and every reused file is checked against its digest anyway
        os.close(f.fd)
        final = self.outdir / self.fnames[tensor]
        os.replace(f.tmp, final)
        if f.kept is not None and len(f.kept) == self.samples:
            _remember(final, np.stack(f.kept))
        self.on_done(tensor, meta)

    def end_group(self) -> None:
        """The group's pack goes into place; only then are its tensors done (so a
        partial manifest never names a pack that is not there)."""
        if self._pack is None:
            return
        members = [m for m, _ in self._pack.members]
        idx = [self.order.get(t, 0) for t, *_ in self._pending]
        name = baseline_pack.pack_name(min(idx), max(idx), members)
        final = self._pack.close(name)
        self._pack = None
        pending, self._pending = self._pending, []
        batched = finished_f32_many([samples for *_, samples in pending])
        for (tensor, meta, offset, kept, samples), stats in zip(pending, batched):
            if stats is None:  # not float32, or NaN/Inf in it: the per-tensor statistics
                st = empty_stats()
                for a in samples:
                    update_stats(st, a)
                stats = finish_stats(st)
            if kept is not None:
                _remember(final, kept, offset)
            self.on_done(tensor, {**meta, "stats": stats, "file": name, "member": self.fnames[tensor],
                                  "offset": offset})

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


# Pages a first run adds on top of the idle process (ORT kernels' code and
# scratch buffers): ~50 MB measured with bench/baseline_memory.py on ORT 1.32.
RUN_ALLOWANCE = 64 * MB


def activation_budget(max_memory: int, weight_bytes: int, sizes: dict) -> int:
    """How many bytes of marked tensors one group may hold so that the whole
    process stays near `max_memory`.

    Subtracted: what the process already holds (Python, ORT, numpy, inputs),
    the weights twice (our model proto and the session's copy), and two of the
    largest tensors (the allocator keeps freed blocks around and ORT still
    holds unmarked intermediates while a group runs)."""
    try:
        import psutil

        floor = psutil.Process().memory_info().rss
    except Exception:
        floor = 0
    largest = max((v for v in sizes.values() if v), default=0)
    return max(max_memory - floor - RUN_ALLOWANCE - 2 * weight_bytes - 2 * largest, 1)


def process_floor() -> int:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:
        return 0


@dataclass
class BaselineResult:
    manifest: dict
    reused: bool
    seconds: float
    # tensors whose file on disk did not match its manifest digest: recomputed
    recomputed: list = field(default_factory=list)


def baseline_key(info: ModelInfo, inputs: InputSet) -> str:
    import onnxruntime as ort

    return stable_key("baseline/v1", info.sha256, inputs_sha(inputs), ort.__version__)


def npy_data_sha256(path: Path, chunk: int = 1 << 22) -> tuple[str, tuple, str]:
    """SHA-256 of an .npy file's data (what the manifest records), its shape and dtype."""
    with safepath.open_read(path.parent, path.name) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        h = hashlib.sha256()
        while True:
            b = fh.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest(), tuple(shape), np.dtype(dtype).name


def _read_pack(outdir: Path, name: str, packs: Optional[dict]) -> bytes:
    if packs is not None and name in packs:
        return packs[name]
    with safepath.open_read(outdir, name) as fh:
        data = fh.read()
    if packs is not None:
        packs.clear()  # one pack at a time: entries come grouped by pack
        packs[name] = data
    return data


def entry_problem(outdir: Path, e: object, samples: Optional[int] = None,
                  packs: Optional[dict] = None) -> Optional[str]:
    """Why a manifest entry cannot be trusted (None when its file matches its digest).

    Checked before any tensor is reused: the file name is a plain name inside
    the baseline folder (no `..`, no absolute path, no link), and the data's
    SHA-256, shape and dtype are the ones written with it. A packed tensor's
    bytes are checked the same way inside its pack (`packs` keeps the last pack
    read, so a pack of thousands of members is read once)."""
    try:
        if not isinstance(e, dict):
            return "not an object"
        name = e["file"]
        if not safepath.is_plain_name(name):
            return f"file name {name!r} is not a plain name in the baseline folder"
        if baseline_pack.is_packed(e) and not safepath.is_plain_name(e["member"]):
            return f"member name {e['member']!r} is not a plain name"
        p = outdir / name
        if not safepath.regular_file(p):
            return "file missing" if not os.path.lexists(p) else "not a regular file (a link?)"
        if baseline_pack.is_packed(e):
            digest, shape, dtype = baseline_pack.digest_at(_read_pack(outdir, name, packs), e["offset"])
        else:
            digest, shape, dtype = npy_data_sha256(p)
        want = tuple([samples, *e["shape"]]) if samples is not None else shape
        if shape != want or dtype != e["dtype"]:
            return f"holds {dtype} {list(shape)}, the manifest says {e['dtype']} {list(want)}"
        if digest != e["sha256"]:
            return "contents differ from the SHA-256 written with it"
        return None
    except safepath.UnsafePath as exc:
        return str(exc)
    except (KeyError, TypeError, ValueError, OSError) as exc:
        return f"unreadable ({type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''})"


def _check_manifest(session: Session, m: object) -> tuple[Optional[dict], list[dict], list[dict]]:
    """(manifest or None, trusted entries, bad entries with reasons)."""
    if not isinstance(m, dict) or not isinstance(m.get("tensors"), list):
        return None, [], []
    samples = m.get("samples") if isinstance(m.get("samples"), int) else None
    good, bad = [], []
    packs: dict = {}
    for e in m["tensors"]:
        why = entry_problem(session.baseline_dir, e, samples, packs)
        if why is None:
            good.append(e)
        else:
            bad.append({"tensor": e.get("tensor") if isinstance(e, dict) else None, "why": why})
    return m, good, bad


def load_manifest(session: Session) -> Optional[dict]:
    """The finished baseline's manifest when every tensor file matches its digest."""
    m, good, bad = _check_manifest(session, session.read_json("baseline/manifest.json"))
    if m is None or bad:
        return None
    return m


def run_baseline(
    info: ModelInfo,
    session: Session,
    inputs: InputSet,
    shapes: dict[str, list[int]],
    max_memory: int,
    cancel: Optional[CancelToken] = None,
    progress: ProgressFn = no_progress,
    last_session=None,
) -> BaselineResult:
    """Dump every intermediate tensor; reuse a valid earlier dump (or its finished part).

    `last_session`: given the dump's last ORT session before it goes (runner.run_groups)."""
    t0 = time.perf_counter()
    key = baseline_key(info, inputs)
    outdir = session.baseline_dir
    tensors = info.index.intermediate_tensors()
    fnames = file_names(info, tensors)
    done: dict[str, dict] = {}
    recomputed: list[dict] = []
    # A finished dump, else the finished part of an interrupted one: every file
    # is checked against the digest written with it before it is trusted.
    for rel in ("baseline/manifest.json", "baseline/manifest.partial.json"):
        m, good, bad = _check_manifest(session, session.read_json(rel))
        if m is None or m.get("key") != key:
            continue
        good = [e for e in good if e.get("tensor") in fnames
                and baseline_pack.entry_name(e) == fnames[e["tensor"]]]
        if rel.endswith("manifest.json") and not bad and len(good) == len(m["tensors"]):
            return BaselineResult(m, True, 0.0)
        recomputed = bad
        if bad and rel.endswith("manifest.json"):
            # no longer a finished dump: the partial manifest written below takes over
            session.path(rel).unlink()
        for e in good:
            done[e["tensor"]] = e
        break
    if recomputed:
        shown = ", ".join(str(b["tensor"]) for b in recomputed[:3]) + ("..." if len(recomputed) > 3 else "")
        progress(Progress("baseline", f"{len(recomputed)} saved tensor file(s) failed their digest check "
                          f"and are recomputed ({shown}: {recomputed[0]['why']})"))
    outdir.mkdir(parents=True, exist_ok=True)
    todo = [t for t in tensors if t not in done]

    sizes, types = model_sizes(info, shapes)
    act_budget = activation_budget(max_memory, info.initializer_bytes, sizes)
    groups = plan_groups(todo, sizes, act_budget)
    from bisect_tui.core.memory import memory_budget_warning

    floor = process_floor()
    largest = max((v for v in sizes.values() if v), default=0)
    memory_warning = memory_budget_warning(
        max_memory, floor, floor + RUN_ALLOWANCE + 2 * info.initializer_bytes + 2 * largest, largest
    ) if todo else ""
    if memory_warning:
        progress(Progress("baseline", "warning: " + memory_warning, 0, None, {"warning": memory_warning}))
    written = {"bytes": sum(e["bytes"] for e in done.values())}

    def entry(t: str, meta: dict) -> dict:
        node = info.index.by_name[info.index.producer[t]]
        return {
            "tensor": t,
            "node": node.name,
            "op_type": node.op_type,
            "index": info.index.order[node.name],
            "file": fnames[t],
            **meta,
        }

    def on_done(t: str, meta: dict) -> None:
        done[t] = entry(t, meta)
        written["bytes"] += meta["bytes"]

    def write_partial(gi: int, _group: list[str]) -> None:
        if gi == len(groups) - 1:
            return  # the last group: the manifest itself comes next (a kill between redoes this group)
        atomic.write_json(
            outdir / "manifest.partial.json",
            {"key": key, "tensors": [done[t] for t in tensors if t in done]}, compact=True,
        )

    def relay(p: Progress) -> None:
        progress(
            Progress(
                "baseline",
                f"{len(done)}/{len(tensors)} tensors, {written['bytes'] / MB:.1f} MB written",
                len(done),
                len(tensors),
                {**p.data, "mb_written": written["bytes"] / MB, "budget_mb": max_memory / MB},
            )
        )

    small = sum(v or 0 for v in sizes.values()) * max(inputs.samples, 1) <= REMEMBER_BASELINE_BYTES
    pack = len(tensors) >= baseline_pack.PACK_MIN_TENSORS
    order = {t: info.index.order[info.index.producer[t]] for t in todo} if pack else None
    sink = _NpySink(outdir, fnames, inputs.samples, on_done, remember=small, pack=pack, order=order)
    progress(Progress("baseline", f"{len(tensors)} tensors in {len(groups)} group(s)", len(done), len(tensors)))
    try:
        run_groups(
            info.model, groups, inputs, sink, types, cancel, relay, "baseline", write_partial,
            last_session=last_session,
        )
    finally:
        sink.abort()
    ordered = [done[t] for t in tensors if t in done]
    skipped = [t for t in tensors if t not in done]
    manifest = {
        "key": key,
        "created": now_iso(),
        "model_sha256": info.sha256,
        "samples": inputs.samples,
        "options": {
            "optimization": "ORT_DISABLE_ALL",
            "precision": "fp32",
            "provider": "CPUExecutionProvider",
            "max_memory_bytes": max_memory,
            "groups": len(groups),
            **({"memory_warning": memory_warning} if memory_warning else {}),
        },
        "graph_inputs": inputs.describe(),
        "graph_outputs": list(info.outputs),
        "tensors": ordered,
        "skipped": skipped,
        "bytes": sum(e["bytes"] for e in ordered),
    }
    atomic.write_json(outdir / "run.json", {"versions": versions(), "seconds": time.perf_counter() - t0})
    _flush_to_disk(outdir)  # the tensors' bytes on disk before the manifest says they are there
    atomic.write_json(session.manifest_path, manifest, compact=True)  # last: marks the dump complete
    try:
        (outdir / "manifest.partial.json").unlink()
    except FileNotFoundError:
        pass
    if recomputed:
        manifest["recomputed"] = recomputed
    return BaselineResult(manifest, False, time.perf_counter() - t0, recomputed)


def _flush_to_disk(folder: Optional[Path] = None) -> None:
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


_LAST_INDEX: list = []  # [(manifest, its tensors list, length, index)]: the last manifest indexed


def _entry(manifest: dict, tensor: str) -> Optional[dict]:
    """The manifest entry of `tensor`: a dict lookup, not a scan (the probe and
    the arbiter look up thousands of tensors of one manifest)."""
    tensors = manifest["tensors"]
    if not (_LAST_INDEX and _LAST_INDEX[0][0] is manifest and _LAST_INDEX[0][1] is tensors
            and _LAST_INDEX[0][2] == len(tensors)):
        _LAST_INDEX[:] = [(manifest, tensors, len(tensors), manifest_index(manifest))]
    return _LAST_INDEX[0][3].get(tensor)


# Small baseline tensors read once per process: the probe, the local
# judgement and region isolation each look up thousands of them, several
# times per run. Keyed by the file's identity (inode, size, mtime), so a file
# replaced on disk is read again; read-only, so no caller can change what the
# next one gets. Big tensors stay memory-mapped and uncached.
SMALL_TENSOR_BYTES = 1 << 20
CACHE_BUDGET_BYTES = 256 << 20
_CACHE: "OrderedDict[tuple, np.ndarray]" = OrderedDict()
_CACHE_BYTES = [0]


# a baseline this small is kept in the read cache as it is dumped (whole)
REMEMBER_BASELINE_BYTES = 64 << 20


def _cache_key(path: Path, st: os.stat_result) -> tuple:
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _cache_put(key: tuple, arr: np.ndarray) -> None:
    arr.flags.writeable = False
    _CACHE[key] = arr
    _CACHE_BYTES[0] += arr.nbytes
    while _CACHE_BYTES[0] > CACHE_BUDGET_BYTES and _CACHE:
        _, old = _CACHE.popitem(last=False)
        _CACHE_BYTES[0] -= old.nbytes


def _remember(path: Path, arr: np.ndarray, offset: Optional[int] = None) -> None:
    """A tensor just written: the read cache gets the very array (file identity as now)."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    _cache_put(_cache_key(path, st) + ((offset,) if offset is not None else ()), arr)


def _load_packed(path: Path, st: os.stat_result, e: dict) -> np.ndarray:
    ident = _cache_key(path, st)
    key = ident + (e.get("offset"),)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    def read() -> bytes:
        with safepath.open_read(path.parent, path.name) as fh:
            return fh.read()

    try:
        arr = baseline_pack.array_at(baseline_pack.read_once(ident, read), e.get("offset"))
    except ValueError as exc:
        raise safepath.UnsafePath(f"baseline pack {path.name}: {exc}") from None
    _cache_put(key, arr)
    return arr


_BASE_DIRS: dict[str, tuple[Path, int, int]] = {}  # session root -> (checked baseline folder, its identity)


def _baseline_dir(session: Session) -> Path:
    """session.baseline_dir, fully checked (no link, inside the session) once and
    then only confirmed to be the same real folder (one lstat): the probe and the
    search look up thousands of tensors, and the full check resolves every
    component of the path each time (0.1 ms, 0.1 s on a 1,000-node model)."""
    key = str(session.root)
    hit = _BASE_DIRS.get(key)
    if hit is not None:
        try:
            st = os.lstat(hit[0])
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == hit[1:]:
            return hit[0]
    d = session.baseline_dir
    try:
        st = os.lstat(d)
    except OSError:
        return d  # missing: the file check below says so
    _BASE_DIRS[key] = (d, st.st_dev, st.st_ino)
    return d


def load_tensor(session: Session, manifest: dict, tensor: str, mmap: bool = True) -> np.ndarray:
    e = _entry(manifest, tensor)
    if e is None:
        raise KeyError(tensor)
    if not safepath.is_plain_name(e.get("file")):
        raise safepath.UnsafePath(f"baseline manifest names {e.get('file')!r}, not a plain file name")
    path = _baseline_dir(session) / e["file"]
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise safepath.UnsafePath(f"baseline tensor {path} is missing or not a regular file")
    if baseline_pack.is_packed(e):
        return _load_packed(path, st, e)
    if st.st_size > SMALL_TENSOR_BYTES:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    key = _cache_key(path, st)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    arr = np.load(path, allow_pickle=False)
    _cache_put(key, arr)
    return arr


def reference_output(info: ModelInfo, session: Session, manifest: dict, inputs: InputSet,
                     name: str) -> np.ndarray:
    """A graph output's baseline value, samples axis first.

    Usually a dumped tensor; but a graph output may also be a graph input
    (passed through) or an initializer (a constant), which no node produces
    and the dump therefore does not hold."""
    if _entry(manifest, name) is not None:
        return np.asarray(load_tensor(session, manifest, name))
    if name in inputs.arrays:
        return np.asarray(inputs.arrays[name])
    init = next((t for t in info.model.graph.initializer if t.name == name), None)
    if init is not None:
        from onnx import numpy_helper

        const = numpy_helper.to_array(init)
        return np.broadcast_to(const[None], (inputs.samples, *const.shape))
    raise KeyError(name)


def manifest_index(manifest: dict) -> dict[str, dict]:
    return {e["tensor"]: e for e in manifest["tensors"]}
