"""Why two shapes differ, in words, so the fix is obvious from the one line.

Dropped or added dims of size 1 are the same tensor (metrics.align reshapes
them); anything else is refused before any number is computed, with the most
likely cause: an extra batch or beam dimension, a transposed layout, another
batch size or sequence length, or a session baseline's samples axis.
"""

from __future__ import annotations

from typing import Optional


def _fmt(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")" if len(shape) != 1 else f"({shape[0]},)"


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _extra_axis(big: tuple[int, ...], small: tuple[int, ...]) -> Optional[int]:
    """The axis of `big` whose removal leaves `small` (after dropping 1-dims)."""
    for i in range(len(big)):
        if _squeeze(big[:i] + big[i + 1:]) == _squeeze(small):
            return i
    return None


def explain(golden: tuple[int, ...], test: tuple[int, ...], samples_axis: bool = False) -> Optional[str]:
    """None when the shapes are the same tensor; otherwise the reason, in words."""
    golden, test = tuple(golden), tuple(test)
    if golden == test or _squeeze(golden) == _squeeze(test):
        return None
    head = f"GOLDEN {_fmt(golden)} vs TEST {_fmt(test)}: "
    if samples_axis and golden[0] > 1 and _squeeze(golden[1:]) == _squeeze(test):
        return head + (f"GOLDEN is a session baseline with {golden[0]} input samples on axis 0 and TEST holds one; "
                       "dump the engine's output for every sample stacked on a leading axis (np.stack), "
                       "or compare against a session made with --samples 1")
    if len(_squeeze(test)) == len(_squeeze(golden)) + 1:
        ax = _extra_axis(test, golden)
        if ax is not None:
            return head + (f"TEST has an extra dimension of size {test[ax]} at axis {ax} (an extra batch or beam "
                           f"dimension?); dump one beam/sample (e.g. out.take(0, axis={ax})) or map to a golden "
                           "tensor that has it")
    if len(_squeeze(golden)) == len(_squeeze(test)) + 1:
        ax = _extra_axis(golden, test)
        if ax is not None:
            return head + (f"GOLDEN has an extra dimension of size {golden[ax]} at axis {ax} that TEST lacks (a "
                           "batch or beam dimension the engine dropped or merged?); dump the test output with it")
    if len(golden) == len(test):
        if sorted(golden) == sorted(test):
            return head + ("the same sizes in another order (a transposed layout such as NHWC vs NCHW, or "
                           "[seq, batch] vs [batch, seq]?); transpose one side before dumping")
        diff = [i for i in range(len(golden)) if golden[i] != test[i]]
        if len(diff) == 1:
            i = diff[0]
            return head + (f"axis {i} is {golden[i]} in GOLDEN and {test[i]} in TEST (another batch size, "
                           "sequence length or padding?); dump both with the same input")
    g_n, t_n = _prod(golden), _prod(test)
    if g_n == t_n:
        return head + ("the same number of elements in another arrangement (flattened or reshaped by the "
                       "engine?); reshape the test dump to the golden shape before saving")
    return head + f"{g_n} vs {t_n} elements; these are not the same tensor (check the mapping)"


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
