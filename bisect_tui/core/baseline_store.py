"""The baseline read back: one tensor of the dump by name, with a read cache.

The probe, the local judgement and region isolation each look up thousands
of small tensors, several times per run: a manifest is indexed once, the
baseline folder is checked once per session, and small tensors are read
once per process (packed members by their offset in their pack, see
baseline_pack.py). Big tensors stay memory-mapped and uncached.
"""

from __future__ import annotations

import os
import stat
from collections import OrderedDict
from pathlib import Path
from typing import Optional

import numpy as np

from bisect_tui.core import baseline_pack, safepath
from bisect_tui.core.inputs import InputSet
from bisect_tui.core.model import ModelInfo
from bisect_tui.core.session import Session


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


def cache_written(path: Path, arr: np.ndarray, offset: Optional[int] = None,
                  st: Optional[os.stat_result] = None) -> None:
    """A tensor just written: the read cache gets the very array (file identity as now).
    `st`: the file's lstat, taken once for the thousands of members of one pack."""
    if st is None:
        try:
            st = os.lstat(path)
        except OSError:
            return
    _cache_put(_cache_key(path, st) + ((offset,) if offset is not None else ()), arr)


def _load_packed(path: Path, st: os.stat_result, e: dict, ident: Optional[tuple] = None) -> np.ndarray:
    ident = _cache_key(path, st) if ident is None else ident
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
    return _load(session, manifest, tensor, mmap, None)


def load_tensors(session: Session, manifest: dict, tensors: list[str], mmap: bool = True) -> list[np.ndarray]:
    """load_tensor of each of `tensors`, in order, with the same checks and errors
    (the first failing tensor raises), for the thousands of one probe group: the
    baseline folder is confirmed and each file's identity read once for the batch,
    not once per tensor (thousands of packed tensors share a file)."""
    files: dict = {}
    return [_load(session, manifest, t, mmap, files) for t in tensors]


def _load(session: Session, manifest: dict, tensor: str, mmap: bool, files: Optional[dict]) -> np.ndarray:
    """One tensor; `files`: what this batch has checked already (file name ->
    (path, lstat, cache key); None -> the baseline folder), None for no batch."""
    e = _entry(manifest, tensor)
    if e is None:
        raise KeyError(tensor)
    name = e.get("file")
    seen = files.get(name) if files is not None and type(name) is str else None
    if seen is None:
        if not safepath.is_plain_name(name):
            raise safepath.UnsafePath(f"baseline manifest names {name!r}, not a plain file name")
        base = files.get(None) if files is not None else None
        if base is None:
            base = _baseline_dir(session)
            if files is not None:
                files[None] = base
        path = base / e["file"]
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise safepath.UnsafePath(f"baseline tensor {path} is missing or not a regular file")
        seen = (path, st, _cache_key(path, st))
        if files is not None:
            files[name] = seen
    path, st, ident = seen
    if baseline_pack.is_packed(e):
        return _load_packed(path, st, e, ident)
    if st.st_size > SMALL_TENSOR_BYTES:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    hit = _CACHE.get(ident)
    if hit is not None:
        _CACHE.move_to_end(ident)
        return hit
    arr = np.load(path, allow_pickle=False)
    _cache_put(ident, arr)
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
        from bisect_tui.core.external_data import tensor_array

        const = tensor_array(init)
        return np.broadcast_to(const[None], (inputs.samples, *const.shape))
    raise KeyError(name)


def manifest_index(manifest: dict) -> dict[str, dict]:
    return {e["tensor"]: e for e in manifest["tensors"]}


def indexed(manifest: dict) -> dict[str, dict]:
    """manifest_index(manifest), the one load_tensor looks names up in: built once
    per manifest (the probe asks on every call, 21,000 entries). Read-only."""
    _entry(manifest, "")
    return _LAST_INDEX[0][3]
