"""Bringing both sides to numbers that can be subtracted, and saying what was done.

The article's two lost days: an FP16 engine output dumped as raw 16-bit words
(or an INT8 one without its scale) minus an FP32 golden looks like a huge
error that is only a dtype mix-up. Here each side is turned into values a
float64 subtraction can use, without copying when a reinterpretation is
enough (a uint16 buffer viewed as float16/bfloat16 bits), and every step is
recorded so the report can say "test: uint16 -> float16, raw bits".

Raw 16-bit words are ambiguous: float16 or bfloat16. Without a hint both
readings are tried on a slice against the golden values and the closer one is
used; the record says so, with both figures, and how to force either.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from bisect_tui.core.compare.records import Conversion
from bisect_tui.core.errors import UserError
from bisect_tui.core.escape import term

PROBE = 1 << 16
"""Elements used to decide between float16 and bfloat16 bits."""

_RAW = {
    "fp16": (2, "float16"),
    "bf16": (2, "bfloat16"),
    "float8_e4m3fn": (1, "float8_e4m3fn"),
    "float8_e5m2": (1, "float8_e5m2"),
}
_INT_HINTS = ("int8", "uint8", "int32")


def _ml(name: str) -> np.dtype:
    if name == "float16":
        return np.dtype(np.float16)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


def is_floating(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or (dtype.kind == "V" and dtype.itemsize in (1, 2) and dtype.names is None)


def _probe_err(values: np.ndarray, other: np.ndarray) -> float:
    a = np.asarray(values.reshape(-1)[:PROBE], dtype=np.float64)
    b = np.asarray(other.reshape(-1)[:PROBE], dtype=np.float64)
    n = min(a.size, b.size)
    a, b = a[:n], b[:n]
    ok = np.isfinite(a) & np.isfinite(b)
    if not ok.any():
        return math.inf
    # a bad reading also produces NaN/Inf and huge exponents: count them as errors
    return float(np.mean(np.abs(a[ok] - b[ok]))) + (n - int(ok.sum())) * 1e30


def _view_raw(arr: np.ndarray, kind: str, side: str, how: str) -> tuple[np.ndarray, Conversion]:
    size, target = _RAW[kind]
    if arr.dtype.itemsize != size or arr.dtype.kind not in "uiV":
        raise UserError(f"{side} is {arr.dtype} but {kind} raw bits need a {size}-byte integer dump")
    return arr.view(_ml(target)), Conversion(side, str(arr.dtype), target, how)


def to_comparable(arr: np.ndarray, side: str, other: np.ndarray, hint: Optional[str] = None,
                  scale: Optional[float] = None, zero_point: float = 0.0,
                  name: str = "") -> tuple[np.ndarray, list[Conversion], str]:
    """One side as floats (or integers, when both sides are integers), the conversions
    made, and the precision it was produced in ("float16", "bfloat16", "int8"...)
    which picks the default tolerance preset."""
    conv: list[Conversion] = []
    dt = arr.dtype
    label = term(name)
    if dt.kind == "V" and dt.itemsize == 2 and dt.names is None and hint is None:
        hint = "bf16"
        how = "stored as |V2 by np.save of an ml_dtypes bfloat16 array; read as bfloat16"
        arr, c = _view_raw(arr, hint, side, how)
        return arr, [c], "bfloat16"
    if hint in _RAW:
        if dt.kind == "f" and dt.itemsize >= 2:
            # already converted by the dumper: nothing to reinterpret, but the precision it
            # was produced in still picks the tolerance
            return arr, conv, f"{_RAW[hint][1]} (declared {hint}, stored as {dt.name})"
        how = f"raw {8 * _RAW[hint][0]}-bit words read as {_RAW[hint][1]} bits (declared {hint})"
        arr, c = _view_raw(arr, hint, side, how)
        return arr, [c], _RAW[hint][1]
    if dt.kind == "f" or (dt.kind == "V" and dt.itemsize == 1 and dt.names is None):
        return arr, conv, dt.name
    if dt.kind == "b":
        return arr.astype(np.float64), [Conversion(side, "bool", "float64", "True/False as 1/0")], "bool"
    if dt.kind in "iu":
        other_float = is_floating(other.dtype)
        if scale is not None:
            if not (scale > 0 and math.isfinite(scale)):
                raise UserError(f"{side} {label}: scale must be a finite number > 0, got {scale}")
            q = np.asarray(arr, dtype=np.float64)
            out = (q - zero_point) * scale
            how = f"dequantized: (q - {zero_point:g}) * {scale:g}"
            return out, [Conversion(side, dt.name, "float64", how)], f"{dt.name} quantized"
        if dt.itemsize == 2 and dt.kind == "u" and other_float:
            e16 = _probe_err(arr.view(np.float16), other)
            eb = _probe_err(arr.view(_ml("bfloat16")), other)
            kind = "fp16" if e16 <= eb else "bf16"
            fig = f"mean |err| {e16:.3g} as float16 bits vs {eb:.3g} as bfloat16 bits"
            how = (f"raw 16-bit words read as {_RAW[kind][1]} bits, chosen automatically ({fig}); "
                   f"force with --test-dtype {label}={'bf16' if kind == 'fp16' else 'fp16'}")
            arr, c = _view_raw(arr, kind, side, how)
            return arr, [c], _RAW[kind][1]
        if other_float:
            raise UserError(
                f"{side} {label!r} is {dt.name} but the other side is {other.dtype}: give its quantization "
                f"scale (--scale {label}=SCALE[:ZERO_POINT] or `scale:` in the mapping file), or "
                f"--test-dtype {label}=fp16/bf16 if these are raw half-precision words")
        return arr, conv, dt.name
    raise UserError(f"{side} {label!r}: dtype {dt} cannot be compared numerically")


def widenings(g: np.ndarray, t: np.ndarray) -> list[Conversion]:
    """Record that both sides are compared in float64 when their dtypes differ: an FP16
    minus FP32 done in FP16 (or FP32 accumulation) would add error of its own."""
    if g.dtype == t.dtype:
        return []
    exact = all(a.dtype.kind in "fbV" or (a.dtype.kind in "iu" and a.dtype.itemsize <= 4) for a in (g, t))
    return [Conversion("both", f"golden {g.dtype}, test {t.dtype}", "float64",
                       "widened for the subtraction (every metric is computed in float64)", exact)]


def hint_for_preset(precision: str) -> str:
    """Default tolerance preset for the precision the test was produced in."""
    if precision.endswith("quantized"):
        return "int8"
    p = precision.split(" ")[0]
    if p in ("float16",):
        return "fp16"
    if p in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return "bf16"
    if p in ("int8", "uint8", "int16", "uint16", "int4", "uint4"):
        return "int8"
    return "fp32"
