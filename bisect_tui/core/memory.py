"""The memory budget: how much the process may hold, and giving it back.

Marking every activation at once makes an unfused session keep all of them
alive: the peak is the sum of all activations (several GB on real models).
The baseline and the determinism run therefore split tensors into groups that
fit a budget derived from `--max-memory` and what the process already holds.
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_right
from itertools import accumulate

from bisect_tui.core.errors import UserError

MB = 1 << 20
# Pages a first run adds on top of the idle process (the reference's kernels'
# code and scratch buffers): ~50 MB measured with bench/baseline_memory.py.
RUN_ALLOWANCE = 64 * MB
# below this a group's arrays are too small for a trim to give anything back
RELEASE_AFTER_BYTES = 32 << 20
# What one whole-graph build adds per node of the model, beside its weights and tensors:
# an ONNX Runtime session of bench/scale_models.py's stacks grows the process by 7.5 KB a
# node, and the optimized copy, its fused-node map and the records made of it about as much
# again (docs/benchmarks.md section 4)
BUILD_BYTES_PER_NODE = 16 << 10
# What a fresh second-run process holds before its first group (the interpreter, numpy, onnx,
# the reference's library warmed up): 66 MB measured with ONNX Runtime; room for heavier ones
FRESH_PROCESS_FLOOR = 160 * MB


def memory_budget_warning(max_memory: int, floor: int, needed: int, largest: int) -> str:
    """A budget the process already (nearly) fills leaves room for one tensor per
    group: correct, but a fresh session per tensor is many times slower. Say so."""
    if largest <= 0 or max_memory - needed >= 2 * largest:
        return ""
    return (f"--max-memory {max_memory / MB:.0f} MB is below what the process needs before dumping "
            f"({floor / MB:.0f} MB already held, {needed / MB:.0f} MB with the model and engine): tensors "
            f"will be dumped one per group, which is much slower; give at least "
            f"--max-memory {int((needed + 8 * largest) / MB) + 1}M")


def default_max_memory() -> int:
    """A quarter of the memory available now, clamped to [256 MB, 16 GB]."""
    try:
        import psutil

        avail = psutil.virtual_memory().available
    except Exception:
        avail = 4 << 30
    return int(min(max(avail // 4, 256 * MB), 16 << 30))


def parse_memory(text: str) -> int:
    """`2G`, `512M`, `1.5GB`, `1000000` -> bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        value = float(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else float(t)
    except ValueError:
        raise UserError(f"bad memory size {text!r}: use e.g. 512M or 2G") from None
    if not math.isfinite(value) or value < 1 * MB:
        raise UserError(f"bad memory size {text!r}: it must be a finite size of at least 1M (e.g. 512M or 2G)")
    return int(value)


def process_floor() -> int:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:
        return 0


def weight_copies(info) -> int:
    """Copies of the weights a run holds: the session's, plus our model proto's,
    except for a model with external data, whose proto holds none (core/external_data.py)."""
    return 1 if getattr(info, "external", None) else 2


def runs_within(items: list, size, budget: int) -> list[list]:
    """`items` cut, in order, into runs whose `size(item)` add up to at most `budget`
    (an item bigger than the budget alone in its run): the baseline's groups, and the
    batches of the vectorised statistics and comparisons.

    Sizes that are all non-negative ints (bytes, element counts: always, in practice)
    are cut by bisecting their running total, in C, instead of one Python step per
    item (21,000 tensors, six times a bisect); the runs are the same exact integer
    arithmetic gives. Anything else takes the plain loop."""
    items = list(items)
    sizes = list(map(size, items))
    if not sizes:
        return []
    try:
        totals = list(accumulate(sizes, initial=0))  # totals[k]: the size of items[:k]
    except (TypeError, OverflowError, ValueError):  # numpy ints past int64: the loop says how
        return _runs_loop(items, sizes, budget)
    # a float or numpy size makes the total a float or numpy number: the plain loop then
    if type(totals[-1]) is not int or type(budget) is not int or min(sizes) < 0:
        return _runs_loop(items, sizes, budget)
    runs: list[list] = []
    start, n = 0, len(items)
    while start < n:
        # the longest run from `start` within the budget, at least one item
        end = max(bisect_right(totals, totals[start] + budget, start + 1) - 1, start + 1)
        runs.append(items[start:end])
        start = end
    return runs


def _runs_loop(items: list, sizes: list, budget) -> list[list]:
    runs: list[list] = []
    run: list = []
    used = 0
    for item, n in zip(items, sizes):
        if run and used + n > budget:
            runs.append(run)
            run, used = [], 0
        run.append(item)
        used += n
    if run:
        runs.append(run)
    return runs


def activation_budget(max_memory: int, weight_bytes: int, sizes: dict, copies: int = 2,
                      floor: "int | None" = None) -> int:
    """How many bytes of marked tensors one group may hold so that the whole
    process stays near `max_memory`.

    Subtracted: what the process already holds (Python, the reference's library,
    numpy, inputs), the weights `copies` times (our model proto and the session's
    copy; the session's alone with external data: `weight_copies`), and two of
    the largest tensors (the allocator keeps freed blocks around and the session
    still holds unmarked intermediates while a group runs). `floor`: what the
    process running the groups holds before them, this one's RSS by default; the
    second run is a fresh process (FRESH_PROCESS_FLOOR), whatever this one has grown to."""
    floor = process_floor() if floor is None else floor
    largest = max((v for v in sizes.values() if v), default=0)
    return max(max_memory - floor - RUN_ALLOWANCE - copies * weight_bytes - 2 * largest, 1)


def build_footprint(nodes: int, weight_bytes: int, activation_bytes: int) -> int:
    """The most one whole-graph build of the search holds while it builds and runs: the
    weights twice (the marked copy of the model and the engine's), what the engine keeps
    per node, and every activation, since "all fusions blocked" makes each one a graph
    output that lives until the run returns (`activation_bytes`: the baseline's bytes)."""
    return RUN_ALLOWANCE + 2 * weight_bytes + BUILD_BYTES_PER_NODE * nodes + activation_bytes


def builds_that_fit(max_memory: int, held: int, footprint: int) -> int:
    """How many such builds may run at once beside the `held` bytes within `max_memory`."""
    return max(0, (max_memory - held) // max(footprint, 1))


def _libc_trim():
    try:
        import ctypes
        import ctypes.util

        try:  # glibc's own name first: find_library runs `ldconfig -p` at every start
            libc = ctypes.CDLL("libc.so.6")
        except OSError:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


_TRIM = _libc_trim()


def release_memory() -> None:
    """Give freed activations back to the OS between groups.

    glibc raises its mmap threshold after large frees, so later 16 MB
    tensors land on the heap and stay resident after being freed; without a
    trim the process grows by a group's worth over the budget."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
