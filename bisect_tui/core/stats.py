"""Streaming per-tensor statistics gathered while the baseline is dumped.

Computed sample by sample and merged, so the range check never reloads a
tensor: NaN/Inf counts, FP16/BF16 overflow and underflow counts, and a
magnitude histogram (floor(log2|x|)) that shows at a glance how a tensor sits
inside a low-precision type's range.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from bisect_tui.core.memory import runs_within

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0**-14  # below this FP16 loses precision (subnormal)
FP16_ZERO_BELOW = 2.0**-25  # below this a value rounds to zero in FP16
BF16_MAX = 3.3895313892515355e38
BF16_ZERO_BELOW = 2.0**-134  # half of BF16's smallest subnormal
LOG2_LO, LOG2_HI = -32, 32  # magnitude histogram range (exponents), clamped


def empty_stats() -> dict:
    return {
        "numel": 0,
        "finite": 0,
        "nan": 0,
        "inf": 0,
        "zeros": 0,
        "min": math.inf,
        "max": -math.inf,
        "abs_max": 0.0,
        "sum": 0.0,
        "sumsq": 0.0,
        "fp16_overflow": 0,
        "fp16_subnormal": 0,
        "fp16_underflow": 0,
        "bf16_overflow": 0,
        "bf16_underflow": 0,
        "log2_hist": [0] * (LOG2_HI - LOG2_LO + 1),
    }


CHUNK = 1 << 20  # elements per pass: float64 temporaries stay at a few MB
F32_SLICE = 1 << 18  # float32 elements per pass: the sums add up per slice of this length


class Scratch:
    """Buffers reused by every float32 slice, so the dump does not allocate
    (and fault in) fresh temporaries a few hundred times per tensor: 3.25 MB
    at most, less than the old per-slice temporaries."""

    def __init__(self, n: int = F32_SLICE):
        n = max(min(int(n), F32_SLICE), 2)
        self.n = n
        self.u8 = np.empty(n + 1, np.uint8)  # one spare byte: an odd slice still forms pairs
        self.pairs = np.empty((n + 1) // 2, np.intp)
        self.f64 = np.empty(n, np.float64)


def update_stats(st: dict, a: np.ndarray, scratch: Optional[Scratch] = None) -> dict:
    """Merge one sample's array into `st` (in place) and return it, a chunk at a time."""
    flat = a.reshape(-1)
    if flat.dtype == np.float32 and flat.size:
        flat = np.ascontiguousarray(flat)
        st["numel"] += int(flat.size)
        scr = scratch if scratch is not None and scratch.n >= min(flat.size, F32_SLICE) else Scratch(flat.size)
        for i in range(0, flat.size, F32_SLICE):
            _update_f32(st, flat[i: i + F32_SLICE], scr)
        return st
    for i in range(0, max(flat.size, 1), CHUNK):
        _update(st, flat[i : i + CHUNK])
    return st


_F32 = {name: int(np.array(v, np.float32).view(np.uint32)) for name, v in (
    ("fp16_max", FP16_MAX), ("fp16_min_normal", FP16_MIN_NORMAL), ("fp16_zero_below", FP16_ZERO_BELOW),
    ("bf16_max", BF16_MAX), ("bf16_zero_below", BF16_ZERO_BELOW), ("inf", np.inf))}
# every threshold is exact in float32, so comparing |x| is comparing its bits
assert all(float(np.array(b, np.uint32).view(np.float32)) == v for b, v in (
    (_F32["fp16_max"], FP16_MAX), (_F32["fp16_min_normal"], FP16_MIN_NORMAL),
    (_F32["fp16_zero_below"], FP16_ZERO_BELOW), (_F32["bf16_max"], BF16_MAX),
    (_F32["bf16_zero_below"], BF16_ZERO_BELOW)))
# exponent fields (bits >> 23) of the thresholds; 2**-134 is a float32 subnormal (field 0)
_FIELD = {k: v >> 23 for k, v in _F32.items()}
assert _FIELD["bf16_zero_below"] == 0 and _FIELD["fp16_max"] < _FIELD["bf16_max"] == 254


PAIRS_FROM = 1 << 16  # below this, clearing and summing 65,536 bins costs more than pairs save


def _exponent_fields(raw: np.ndarray, scr: Scratch) -> np.ndarray:
    """How many elements have each exponent field 0..255 (255: NaN or Inf), from
    the bits. Counted two elements at a time (a 65,536-bin count of byte pairs,
    then summed both ways): a plain 256-bin count was the costliest line of the
    dump, because a run of equal fields makes each increment wait on the last."""
    n = raw.size
    u8 = scr.u8[: n + (n & 1)]
    np.right_shift(raw, 23, out=u8[:n], casting="unsafe")  # the cast to uint8 drops the sign bit
    if n < PAIRS_FROM:
        return np.bincount(u8[:n], minlength=256)
    if n & 1:
        u8[n] = 0  # a spare zero field, taken off again below
    pairs = scr.pairs[: u8.size // 2]
    np.copyto(pairs, u8.view(np.uint16))
    c = np.bincount(pairs, minlength=1 << 16).reshape(256, 256)  # [high byte, low byte]
    field = c.sum(axis=0) + c.sum(axis=1)
    if n & 1:
        field[0] -= 1
    return field


def _sums(st: dict, f: np.ndarray, scr: Scratch) -> None:
    """Sum and sum of squares in float64, pairwise, in the scratch buffer (no BLAS:
    numpy's dot woke BLAS threads for each slice, 9 ns an element on two busy cores)."""
    v = scr.f64[: f.size]
    np.copyto(v, f)
    st["sum"] += float(v.sum())
    np.multiply(v, v, out=v)
    st["sumsq"] += float(v.sum())


def _update_f32(st: dict, a: np.ndarray, scr: Scratch) -> dict:
    """float32 (the common case) on its bits: the exponent field is floor(log2|x|)
    + 127 for normal numbers and the thresholds compare as integers, so no
    float64 copy or frexp is needed for the counts. One count of the exponent
    fields gives the NaN/Inf total, the histogram and most threshold counts; a
    pass over the bits runs only where a field straddles a threshold. Same
    numbers as `_update`."""
    raw = a.view(np.uint32)
    field = _exponent_fields(raw, scr)
    nonfinite = int(field[255])
    f16max, b16max = _FIELD["fp16_max"], _FIELD["bf16_max"]
    # |x|'s bits, only where some count needs more than the fields: non-finite
    # values, zeros/subnormals (field 0), or a field holding the FP16 or BF16 maximum
    bits = raw & np.uint32(0x7FFFFFFF) if (nonfinite or field[0] or field[f16max] or field[b16max]) else None
    if nonfinite:
        nan = int(np.count_nonzero(bits > np.uint32(_F32["inf"])))
        st["nan"] += nan
        st["inf"] += nonfinite - nan
    nfin = int(a.size) - nonfinite
    st["finite"] += nfin
    if nfin == 0:
        return st
    f = a[bits < np.uint32(_F32["inf"])] if nonfinite else a
    lo, hi = float(f.min()), float(f.max())
    st["min"] = min(st["min"], lo)
    st["max"] = max(st["max"], hi)
    st["abs_max"] = max(st["abs_max"], -lo, hi)  # |x| is largest at one end; negation is exact
    _sums(st, f, scr)
    zeros = subnormal = 0
    if field[0]:
        zeros = int(bits.size) - int(np.count_nonzero(bits))
        subnormal = int(field[0]) - zeros
    st["zeros"] += zeros
    # |x| > FP16_MAX: every finite field above its own, and in its own the larger mantissas
    if field[f16max]:
        st["fp16_overflow"] += int(np.count_nonzero(bits > np.uint32(_F32["fp16_max"]))) - nonfinite
    else:
        st["fp16_overflow"] += int(field[f16max + 1: 255].sum())
    if field[b16max]:  # the BF16 maximum lies in the last finite field
        st["bf16_overflow"] += int(np.count_nonzero(bits > np.uint32(_F32["bf16_max"]))) - nonfinite
    # the FP16 thresholds are powers of two: |x| below one is an exponent field below its own
    below = np.cumsum(field)
    st["fp16_subnormal"] += int(below[_FIELD["fp16_min_normal"] - 1]) - zeros
    st["fp16_underflow"] += int(below[_FIELD["fp16_zero_below"] - 1]) - zeros
    # 2**-134 is a float32 subnormal: only subnormals can lie below it
    if subnormal:
        st["bf16_underflow"] += int(np.count_nonzero(bits < np.uint32(_F32["bf16_zero_below"]))) - zeros
    # histogram of floor(log2|x|) clamped to [LOG2_LO, LOG2_HI]; float32 subnormals
    # (field 0, not zero) lie below 2**-126: the lowest bin
    lo_f, hi_f = LOG2_LO + 127, LOG2_HI + 127  # fields 95 and 159
    hist = st["log2_hist"]
    hist[0] += subnormal + int(field[1: lo_f + 1].sum())
    for k, c in enumerate(field[lo_f + 1: hi_f].tolist(), start=1):
        hist[k] += c
    hist[-1] += int(field[hi_f: 255].sum())
    return st


def _update(st: dict, a: np.ndarray) -> dict:
    st["numel"] += int(a.size)
    if a.size == 0 or a.dtype.kind not in "fiub":
        return st
    if a.dtype.kind == "b":
        a = a.astype(np.uint8)
    if a.dtype.kind == "f":
        finite_mask = np.isfinite(a)
        nfin = int(np.count_nonzero(finite_mask))
        nan = int(np.count_nonzero(np.isnan(a)))
        st["nan"] += nan
        st["inf"] += int(a.size) - nfin - nan
        f = a[finite_mask] if nfin != a.size else a.reshape(-1)
    else:
        nfin = int(a.size)
        f = a.reshape(-1)
    st["finite"] += nfin
    if nfin == 0:
        return st
    f64 = f.astype(np.float64, copy=False)
    st["min"] = min(st["min"], float(f64.min()))
    st["max"] = max(st["max"], float(f64.max()))
    absf = np.abs(f64)
    st["abs_max"] = max(st["abs_max"], float(absf.max()))
    st["sum"] += float(f64.sum())
    st["sumsq"] += float(np.square(f64).sum())  # pairwise, as `_sums` does for float32
    nz = absf != 0
    st["zeros"] += nfin - int(np.count_nonzero(nz))
    if a.dtype.kind == "f":
        st["fp16_overflow"] += int(np.count_nonzero(absf > FP16_MAX))
        st["fp16_subnormal"] += int(np.count_nonzero(nz & (absf < FP16_MIN_NORMAL)))
        st["fp16_underflow"] += int(np.count_nonzero(nz & (absf < FP16_ZERO_BELOW)))
        st["bf16_overflow"] += int(np.count_nonzero(absf > BF16_MAX))
        st["bf16_underflow"] += int(np.count_nonzero(nz & (absf < BF16_ZERO_BELOW)))
    _, exp = np.frexp(absf[nz])
    exp = np.clip(exp.astype(np.int64) - 1, LOG2_LO, LOG2_HI) - LOG2_LO
    counts = np.bincount(exp, minlength=LOG2_HI - LOG2_LO + 1)
    st["log2_hist"] = [int(x + y) for x, y in zip(st["log2_hist"], counts)]
    return st


def finish_stats(st: dict) -> dict:
    """Derive mean/std and replace infinities of an all-non-finite tensor with None."""
    out = dict(st)
    n = st["finite"]
    if n:
        mean = st["sum"] / n
        out["mean"] = mean
        out["std"] = math.sqrt(max(st["sumsq"] / n - mean * mean, 0.0))
    else:
        out["mean"] = out["std"] = None
        out["min"] = out["max"] = None
    out.pop("sum")
    out.pop("sumsq")
    return out


def finished_f32_many(tensors: list[list[np.ndarray]]) -> list[Optional[dict]]:
    """`finish_stats` of each tensor's samples merged, for many small float32
    tensors at once: one count of exponent fields over all of them, segment
    minima and maxima, and each sample's sums over the same float64 values as
    `_sums` in the same order, so every figure equals the per-tensor path's.
    A tensor that is not float32, is empty, or holds a NaN or Inf gets None
    (the caller takes the per-tensor path: those need masks). Per tensor the
    per-tensor path was ~45 us of Python and numpy calls, most of a
    5,000-tensor dump's statistics."""
    out: list[Optional[dict]] = [None] * len(tensors)
    f32 = np.dtype(np.float32)  # compared as a dtype: `== np.float32` converts the type per array
    picked = [k for k, s in enumerate(tensors) if s and all(a.dtype == f32 and a.size for a in s)]
    elems = {k: sum(a.size for a in tensors[k]) for k in picked}
    with np.errstate(invalid="ignore", over="ignore"):  # sums of segments with Inf: dropped below
        for chunk in runs_within(picked, elems.__getitem__, BATCH_ELEMENTS):
            _f32_many(tensors, chunk, out)
    return out


# Elements of one batch of `finished_f32_many`: its temporaries take ~25 bytes an element
# (the histogram key as intp, a float64 copy squared in place, the bits, bytes of fields).
# Unbounded, a 21,000-tensor group holding 306 MB of float32 made 3.2 GB of them at once
# (peak RSS 3.9 GB under --max-memory 2G); per batch of 4M elements they take ~100 MB
# whatever the group's size, and the figures are the same (each tensor is summed alone).
BATCH_ELEMENTS = 1 << 22

# The count bins of an exponent field: 0 (zeros and subnormals), 1-95 together (the
# histogram's lowest bin), 96-158 one each (its inner bins), 159-254 together (its top
# bin), 255 (NaN/Inf): 67 counts per sample instead of 256 and no cumulative sum over them
_NBINS = 67
_BIN_OF_FIELD = np.array([0] + [1] * 95 + list(range(2, 65)) + [65] * 96 + [66], np.uint8)
assert _BIN_OF_FIELD.size == 256 and _BIN_OF_FIELD[LOG2_LO + 127] == 1 and _BIN_OF_FIELD[LOG2_HI + 127] == 65


def _segment_counts(mask: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """How many of each segment's elements `mask` holds (exact: integer sums)."""
    return np.add.reduceat(mask, starts, dtype=np.intp)


def _f32_many(tensors: list[list[np.ndarray]], picked: list[int], out: list[Optional[dict]]) -> None:
    """One batch. The samples are laid out by size (stable), so the samples of one
    size are the rows of one 2-d view: row sums there are the same pairwise sums
    as each sample's own `sum()` (a reduceat is not: it adds a segment's first
    element last), and the histogram keys are a row offset plus a byte, no
    per-element segment index. The rarely non-zero counts (zeros, FP16/BF16
    overflow, BF16 underflow) pass over the bits only when a field says some
    element may count. Results go back to the samples' own order at the end."""
    arrays = [a for k in picked for a in tensors[k]]
    nseg = len(arrays)
    sizes = np.fromiter([a.size for a in arrays], np.intp, nseg)
    perm = np.argsort(sizes, kind="stable")
    ssz = sizes[perm]
    flat = np.concatenate([arrays[i] for i in perm.tolist()], axis=None)  # each raveled in C order
    ends = np.cumsum(ssz)
    starts = ends - ssz
    bits = flat.view(np.uint32) & np.uint32(0x7FFFFFFF)
    fields = np.right_shift(bits, 23).astype(np.uint8)
    bins = np.take(_BIN_OF_FIELD, fields)
    del fields
    keys = np.empty(flat.size, np.intp)
    f64 = flat.astype(np.float64)
    sums = np.empty(nseg, np.float64)
    sumsqs = np.empty(nseg, np.float64)
    groups = np.flatnonzero(np.diff(ssz)) + 1
    bounds = [0, *groups.tolist(), nseg]
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        s, e0 = int(ssz[r0]), int(starts[r0])
        e1 = e0 + (r1 - r0) * s
        offs = np.arange(r0 * _NBINS, r1 * _NBINS, _NBINS, dtype=np.intp)[:, None]
        np.add(bins[e0:e1].reshape(-1, s), offs, out=keys[e0:e1].reshape(-1, s))
        np.add.reduce(f64[e0:e1].reshape(-1, s), axis=1, out=sums[r0:r1])
    np.multiply(f64, f64, out=f64)
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        s, e0 = int(ssz[r0]), int(starts[r0])
        np.add.reduce(f64[e0:e0 + (r1 - r0) * s].reshape(-1, s), axis=1, out=sumsqs[r0:r1])
    del f64, bins
    counts = np.bincount(keys, minlength=nseg * _NBINS).reshape(nseg, _NBINS)
    del keys
    none = np.zeros(nseg, np.intp)
    zeros = _segment_counts(bits == 0, starts) if counts[:, 0].any() else none
    bf16_under = (_segment_counts(bits < np.uint32(_F32["bf16_zero_below"]), starts) - zeros
                  if counts[:, 0].any() else none)
    # |x| > FP16_MAX needs a field of at least FP16_MAX's (142: bin 48); BF16_MAX's is 254 (bin 65)
    fp16_over = (_segment_counts(bits > np.uint32(_F32["fp16_max"]), starts)
                 if counts[:, _BIN_OF_FIELD[_FIELD["fp16_max"]]:].any() else none)
    bf16_over = (_segment_counts(bits > np.uint32(_F32["bf16_max"]), starts)
                 if counts[:, _BIN_OF_FIELD[_FIELD["bf16_max"]]:].any() else none)
    low = counts[:, 0] + counts[:, 1]  # every field up to 95
    fp16_sub = low + counts[:, 2: _FIELD["fp16_min_normal"] - 94].sum(axis=1) - zeros
    fp16_under = low + counts[:, 2: _FIELD["fp16_zero_below"] - 94].sum(axis=1) - zeros
    hist = np.empty((nseg, LOG2_HI - LOG2_LO + 1), np.int64)
    hist[:, 0] = low - zeros
    hist[:, 1:] = counts[:, 2:66]
    mins = np.minimum.reduceat(flat, starts)
    maxs = np.maximum.reduceat(flat, starts)
    inv = np.empty(nseg, np.intp)
    inv[perm] = np.arange(nseg, dtype=np.intp)  # a sample's row in the laid-out order

    def back(x: np.ndarray) -> list:
        return x[inv].tolist()

    sums, sumsqs, mins, maxs = back(sums), back(sumsqs), back(mins), back(maxs)
    nonfinite = back(counts[:, 66])
    per_sample = [sizes.tolist(), *(back(x) for x in (zeros, fp16_over, fp16_sub, fp16_under, bf16_over, bf16_under))]
    hist_rows = back(hist)
    if nseg == len(picked):  # one sample each (the usual dump): nothing to merge
        for k, numel, zero, f16o, f16s, f16u, b16o, b16u, total, sumsq, lo, hi, h, nf in zip(
                picked, *per_sample, sums, sumsqs, mins, maxs, hist_rows, nonfinite):
            if not nf:
                out[k] = _finished(numel, zero, f16o, f16s, f16u, b16o, b16u, total, sumsq, lo, hi, h)
        return
    cols = list(zip(*per_sample))
    j = 0
    for k in picked:
        n = len(tensors[k])
        r = j
        j += n
        if any(nonfinite[r: r + n]):
            continue
        numel, zero, f16o, f16s, f16u, b16o, b16u = cols[r]
        total, sumsq, lo, hi, h = sums[r], sumsqs[r], mins[r], maxs[r], hist_rows[r]
        for q in range(r + 1, r + n):  # the other samples, in order: what update_stats adds up
            total += sums[q]
            sumsq += sumsqs[q]
            lo, hi = min(lo, mins[q]), max(hi, maxs[q])
            h = [x + y for x, y in zip(h, hist_rows[q])]
            numel, zero, f16o, f16s, f16u, b16o, b16u = (
                a + b for a, b in zip((numel, zero, f16o, f16s, f16u, b16o, b16u), cols[q]))
        out[k] = _finished(numel, zero, f16o, f16s, f16u, b16o, b16u, total, sumsq, lo, hi, h)


def _finished(numel, zero, f16o, f16s, f16u, b16o, b16u, total, sumsq, lo, hi, h) -> dict:
    """A finite float32 tensor's finished statistics, in `finish_stats`'s keys and order."""
    mean = total / numel
    return {
        "numel": numel, "finite": numel, "nan": 0, "inf": 0, "zeros": zero,
        "min": lo, "max": hi, "abs_max": max(0.0, -lo, hi),
        "fp16_overflow": f16o, "fp16_subnormal": f16s, "fp16_underflow": f16u,
        "bf16_overflow": b16o, "bf16_underflow": b16u,
        "log2_hist": h, "mean": mean,
        "std": math.sqrt(max(sumsq / numel - mean * mean, 0.0)),
    }
