"""Streaming per-tensor statistics gathered while the baseline is dumped.

Computed sample by sample and merged, so the range check never reloads a
tensor: NaN/Inf counts, FP16/BF16 overflow and underflow counts, and a
magnitude histogram (floor(log2|x|)) that shows at a glance how a tensor sits
inside a low-precision type's range.
"""

from __future__ import annotations

import math

import numpy as np

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


def update_stats(st: dict, a: np.ndarray) -> dict:
    """Merge one sample's array into `st` (in place) and return it, a chunk at a time."""
    flat = a.reshape(-1)
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


def _update_f32(st: dict, a: np.ndarray) -> dict:
    """float32 (the common case) on its bits: the exponent field is floor(log2|x|)
    + 127 for normal numbers and the thresholds compare as integers, so no
    float64 copy or frexp is needed for the counts. Same numbers as `_update`."""
    bits = a.view(np.uint32) & np.uint32(0x7FFFFFFF)
    inf_bits = np.uint32(_F32["inf"])
    nonfinite = int(np.count_nonzero(bits >= inf_bits))
    nan = int(np.count_nonzero(bits > inf_bits))
    st["nan"] += nan
    st["inf"] += nonfinite - nan
    nfin = int(a.size) - nonfinite
    st["finite"] += nfin
    if nfin == 0:
        return st
    if nonfinite:
        keep = bits < inf_bits
        bits, f = bits[keep], a[keep]
    else:
        f = a
    f64 = f.astype(np.float64)
    st["min"] = min(st["min"], float(f.min()))
    st["max"] = max(st["max"], float(f.max()))
    st["abs_max"] = max(st["abs_max"], float(np.array(bits.max(), np.uint32).view(np.float32)))
    st["sum"] += float(f64.sum())
    st["sumsq"] += float(np.dot(f64, f64))
    del f64  # before the histogram: the dump's memory budget counts these temporaries
    # exponent fields 0..254 (finite only)
    field = np.bincount(bits >> np.uint32(23), minlength=256)
    zeros = int(np.count_nonzero(bits == 0))
    st["zeros"] += zeros
    st["fp16_overflow"] += int(np.count_nonzero(bits > np.uint32(_F32["fp16_max"])))
    # the three small thresholds are powers of two: |x| below one is an exponent field below its own
    below = np.cumsum(field)
    st["fp16_subnormal"] += int(below[(_F32["fp16_min_normal"] >> 23) - 1]) - zeros
    st["fp16_underflow"] += int(below[(_F32["fp16_zero_below"] >> 23) - 1]) - zeros
    st["bf16_overflow"] += int(np.count_nonzero(bits > np.uint32(_F32["bf16_max"])))
    st["bf16_underflow"] += int(below[(_F32["bf16_zero_below"] >> 23) - 1]) - zeros if _F32["bf16_zero_below"] >> 23 \
        else int(np.count_nonzero(bits < np.uint32(_F32["bf16_zero_below"]))) - zeros
    hist = st["log2_hist"]
    # float32 subnormals (field 0, not zero) lie below 2**-126: the lowest bin
    hist[0] += int(field[0]) - zeros
    for e in range(1, 255):
        if field[e]:
            hist[min(max(e - 127, LOG2_LO), LOG2_HI) - LOG2_LO] += int(field[e])
    return st


def _update(st: dict, a: np.ndarray) -> dict:
    st["numel"] += int(a.size)
    if a.size == 0 or a.dtype.kind not in "fiub":
        return st
    if a.dtype == np.float32:
        # in slices of 256K: small temporaries (the dump's memory budget and glibc's
        # heap, which keeps what a run of large temporaries leaves behind)
        flat = np.ascontiguousarray(a).reshape(-1)
        for i in range(0, flat.size, 1 << 18):
            _update_f32(st, flat[i: i + (1 << 18)])
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
    st["sumsq"] += float(np.dot(f64, f64))
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
