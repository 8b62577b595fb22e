"""Framework golden data: a forward hook on every module, saved like the baseline.

One `.npy` per module output, `layer_<index>_<module path>.npy` (index = the
order in which the module's forward finished, so children come before their
parents, as in the articles), with a leading samples axis, a SHA-256 per file
and `manifest.json` written last. Memory stays bounded: each hook copies one
output to disk as soon as the module returns and keeps only a hash and a few
statistics, so the process holds what PyTorch's own forward holds plus one
tensor. The second run (the determinism check) only hashes.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch
from torch import nn

from bisect_tui.core import atomic
from bisect_tui.core.graph import safe_name
from bisect_tui.core.stats import empty_stats, finish_stats, update_stats


def flatten_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Tensors of a module's output in order (tuples, lists, dict values)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from flatten_tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from flatten_tensors(v)


def to_numpy(t: torch.Tensor) -> tuple[np.ndarray, str]:
    """A float32 (or integer/bool) array and the dtype the model produced."""
    t = t.detach().cpu()
    dtype = str(t.dtype).replace("torch.", "")
    if t.is_floating_point() and t.dtype != torch.float32:
        t = t.float()  # golden data is FP32; the original dtype is recorded
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.contiguous().numpy(), dtype


@dataclass
class _Slot:
    """One hooked output across samples."""

    name: str
    module: str
    type: str
    call: int
    output: int
    index: int
    shape: tuple
    dtype: str
    model_dtype: str
    sha: Any
    stats: dict
    tmp: Optional[str] = None
    nbytes: int = 0


class GoldenRecorder:
    """Hooks on every module of `model`; `write` mode streams to `outdir`,
    `hash` mode only hashes (for the second run)."""

    def __init__(self, model: nn.Module, samples: int, outdir: Optional[Path] = None,
                 capture: Optional[set[str]] = None):
        self.model = model
        self.capture = capture  # golden names whose arrays to keep in memory (one sample)
        self.captured: dict[str, np.ndarray] = {}
        self.samples = samples
        self.outdir = outdir
        self.slots: dict[tuple, _Slot] = {}
        self.order: list[tuple] = []
        self._sample = 0
        self._calls: dict[str, int] = {}
        self._seen_this_sample: list[tuple] = []
        self._handles = []
        self.errors: list[str] = []
        self._proc = _process()
        self.rss_start = self._proc.memory_info().rss if self._proc else None
        self.rss_peak = self.rss_start

    def __enter__(self) -> "GoldenRecorder":
        for path, mod in self.model.named_modules():
            self._handles.append(mod.register_forward_hook(self._hook(path, type(mod).__name__)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if exc[0] is not None:
            self.abort()

    def begin_sample(self, k: int) -> None:
        self._sample = k
        self._calls = {}
        self._seen_this_sample = []

    def end_sample(self) -> None:
        if self._sample == 0:
            return
        if self._seen_this_sample != self.order:
            self.errors.append(
                f"sample {self._sample}: the modules ran in another order or number than in sample 0 "
                "(data-dependent control flow): golden data cannot be stacked per module")

    def _hook(self, path: str, type_name: str):
        def hook(_module, _inputs, output):
            call = self._calls.get(path, 0)
            self._calls[path] = call + 1
            for k, t in enumerate(flatten_tensors(output)):
                self._record((path, call, k), path, type_name, call, k, t)
        return hook

    def _record(self, key: tuple, path: str, type_name: str, call: int, k: int, t: torch.Tensor) -> None:
        arr, model_dtype = to_numpy(t)
        self._seen_this_sample.append(key)
        slot = self.slots.get(key)
        if slot is None:
            if self._sample != 0:
                return  # reported by end_sample
            index = len(self.order)
            label = safe_name(path or "model", 60)
            name = f"layer_{index:04d}_{label}"
            if call:
                name += f"_call{call + 1}"
            if k:
                name += f"_out{k}"
            slot = _Slot(name, path, type_name, call, k, index, tuple(arr.shape), arr.dtype.name,
                         model_dtype, hashlib.sha256(), empty_stats())
            self.slots[key] = slot
            self.order.append(key)
        if tuple(arr.shape) != slot.shape:
            self.errors.append(f"{slot.name}: shape {slot.shape} in sample 0 but {tuple(arr.shape)} "
                               f"in sample {self._sample}")
            return
        if self.capture is not None and slot.name in self.capture:
            self.captured[slot.name] = arr.copy()
        view = memoryview(np.ascontiguousarray(arr)).cast("B")
        slot.sha.update(view)
        update_stats(slot.stats, arr)
        if self.outdir is not None:
            self._append(slot, arr, view)
        if self._proc is not None:  # resident memory right after the copy: the bound to watch
            self.rss_peak = max(self.rss_peak or 0, self._proc.memory_info().rss)

    def _append(self, slot: _Slot, arr: np.ndarray, view: memoryview) -> None:
        assert self.outdir is not None
        if slot.tmp is None:
            fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=".npy", dir=self.outdir)
            with os.fdopen(fd, "wb") as fh:
                header = {"descr": np.lib.format.dtype_to_descr(arr.dtype), "fortran_order": False,
                          "shape": (self.samples, *arr.shape)}
                np.lib.format.write_array_header_1_0(fh, header)
            slot.tmp = tmp
        with open(slot.tmp, "ab") as fh:  # reopened per write: thousands of modules, no fd limit
            fh.write(view)
        slot.nbytes += arr.nbytes

    def finish(self) -> list[dict]:
        """Rename the files into place (write mode) and return the manifest entries."""
        entries = []
        for key in self.order:
            s = self.slots[key]
            fname = s.name + ".npy"
            if s.tmp is not None:
                with open(s.tmp, "rb+") as fh:
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(s.tmp, self.outdir / fname)
                s.tmp = None
            entries.append({
                "name": s.name, "module": s.module or "(root)", "type": s.type, "call": s.call,
                "output": s.output, "index": s.index, "file": fname, "shape": list(s.shape),
                "dtype": s.dtype, "model_dtype": s.model_dtype, "bytes": s.nbytes,
                "sha256": s.sha.hexdigest(), "stats": finish_stats(s.stats),
            })
        return entries

    def abort(self) -> None:
        for s in self.slots.values():
            if s.tmp:
                try:
                    os.unlink(s.tmp)
                except OSError:
                    pass
                s.tmp = None


def _process():
    try:
        import psutil

        return psutil.Process()
    except Exception:
        return None


@dataclass
class Recorded:
    entries: list[dict]
    problems: list[str]
    rss_start: Optional[int]
    rss_peak: Optional[int]


def run_recorded(model: nn.Module, samples: list[tuple], outdir: Optional[Path]) -> Recorded:
    """Forward every sample under hooks; manifest entries, problems found, memory seen."""
    rec = GoldenRecorder(model, len(samples), outdir)
    with rec, torch.no_grad():
        for k, args in enumerate(samples):
            rec.begin_sample(k)
            model(*args)
            rec.end_sample()
        entries = rec.finish()
    return Recorded(entries, rec.errors, rec.rss_start, rec.rss_peak)


def write_manifest(outdir: Path, manifest: dict) -> None:
    atomic.write_json(outdir / "manifest.json", manifest)


def load_golden(outdir: Path, entry: dict) -> np.ndarray:
    """A golden file, trusted only when its bytes still hash to the manifest's digest."""
    path = (outdir / entry["file"]).resolve()
    if path.parent != outdir.resolve() or path.is_symlink():
        raise ValueError(f"golden file outside its folder: {entry['file']}")
    arr = np.load(path, allow_pickle=False)
    if hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest() != entry["sha256"]:
        raise ValueError(f"golden file {entry['file']} does not match its manifest digest")
    return arr
