"""Reading the two arrays of a comparison: which dtypes can be compared, how a
dropped batch dimension is forgiven, and the chunks every figure streams over.

Tensors can hold tens of millions of elements, so nothing here widens a whole
array: each chunk of ``CHUNK`` elements is widened to float64 on its own.
Callers read ``arrays.CHUNK`` at call time (tests shrink it to force chunking).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

CHUNK = 1 << 20
"""Elements per streamed chunk: 8 MiB per float64 temporary."""


def as_array(x: Any, what: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind == "c":
        raise ValueError(f"{what}: complex dtype {arr.dtype} is not supported")
    if arr.dtype.kind not in "biuf":
        # ml_dtypes' bfloat16/float8 have kind 'V' but cast fine; strings do not.
        try:
            np.zeros(1, dtype=arr.dtype).astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{what}: dtype {arr.dtype} cannot be compared numerically") from exc
    return arr


def align(reference: Any, test: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return both arrays with the reference's shape (original dtypes kept).

    Engines often drop or add a leading batch dim of 1 (``(1, 1000)`` vs
    ``(1000,)``); that is the same tensor, so test is reshaped. Anything else
    is a real mismatch and raises ValueError naming both shapes.
    """
    ref = as_array(reference, "reference")
    tst = as_array(test, "test")
    if ref.shape != tst.shape:
        squeezable = ref.size == tst.size and tuple(d for d in ref.shape if d != 1) == tuple(
            d for d in tst.shape if d != 1
        )
        if not squeezable:
            raise ValueError(
                f"shape mismatch: reference {tuple(ref.shape)} vs test {tuple(tst.shape)}"
            )
        tst = tst.reshape(ref.shape)
    return ref, tst


def spans(size: int) -> range:
    """Start offsets of the chunks over ``size`` elements."""
    return range(0, size, CHUNK)


def chunks(ref: np.ndarray, tst: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield (start, ref64, test64) over the flattened arrays, chunk by chunk."""
    rf = ref.reshape(-1)
    tf = tst.reshape(-1)
    for start in spans(rf.size):
        stop = min(start + CHUNK, rf.size)
        yield start, rf[start:stop].astype(np.float64), tf[start:stop].astype(np.float64)


def finite_pair(
    rc: np.ndarray, tc: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Keep only positions where both are finite; also return their local indices
    (None when every position is finite, the common fast path)."""
    both = np.isfinite(rc)
    both &= np.isfinite(tc)
    if both.all():
        return rc, tc, None
    idx = np.flatnonzero(both)
    return rc[idx], tc[idx], idx
