"""Run an ONNX model on ONNX Runtime CPU with chosen tensors marked, in
memory-bounded groups.

Marking every activation at once makes ORT keep all of them alive: the peak
is the sum of all activations (several GB on real models). Instead tensors are
split, in topological order, into groups whose size fits the budget; each group
gets a fresh session and is streamed to a sink before the next one runs.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol

import numpy as np
import onnx

from bisect_tui.core.cancel import CancelToken, Progress, ProgressFn, no_progress
from bisect_tui.core.errors import UserError
from bisect_tui.core.graph import mark_outputs, tensor_types
from bisect_tui.core.inputs import InputSet

MB = 1 << 20
PROTO_LIMIT = 1_800_000_000  # protobuf refuses to serialize 2 GiB; keep a margin
ORT_QUIET = 4  # FATAL only: ORT's own coloured ERROR lines would print before our one-line error
_ENGINE_LOG: list = [None]  # the session's engine.log, set by Triage.prepare


def set_engine_log(path) -> None:
    """Where the engine's full error texts go (the one-line error points there)."""
    _ENGINE_LOG[0] = path


def log_engine_error(context: str, exc: BaseException) -> str:
    """Append the engine's whole message to the session's engine.log; returns a
    short pointer for the one-line error ("" when no session is open)."""
    path = _ENGINE_LOG[0]
    if path is None:
        return ""
    try:
        from bisect_tui.core.session import now_iso

        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"[{now_iso()}] {context}: {type(exc).__name__}\n{str(exc).rstrip()}\n\n")
    except OSError:
        return ""
    return f" (full engine message in {path.name} in the session)"


def quiet_ort() -> None:
    """Keep ORT's default logger (used before a session has its own) off our output."""
    import onnxruntime as ort

    try:
        ort.set_default_logger_severity(ORT_QUIET)
    except Exception:  # very old releases: the per-session level below still applies
        pass


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


def with_fixed_inputs(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            for d, v in zip(dims, shapes[vi.name]):
                d.Clear()
                d.dim_value = v
    return m


def estimate_sizes(
    model: onnx.ModelProto, shapes: dict[str, list[int]], tensors: Iterable[str]
) -> tuple[dict[str, Optional[int]], dict[str, onnx.TypeProto]]:
    """Bytes per sample of each tensor from shape inference (None when unknown)."""
    types = tensor_types(with_fixed_inputs(model, shapes))
    sizes: dict[str, Optional[int]] = {}
    for t in tensors:
        tp = types.get(t)
        size = None
        if tp is not None and tp.HasField("tensor_type") and tp.tensor_type.elem_type:
            dims = tp.tensor_type.shape.dim
            if tp.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                try:
                    item = np.dtype(
                        onnx.helper.tensor_dtype_to_np_dtype(tp.tensor_type.elem_type)
                    ).itemsize
                    size = int(np.prod([d.dim_value for d in dims], dtype=np.int64)) * item
                except Exception:
                    size = None
        sizes[t] = size
    return sizes, types


def model_sizes(info, shapes: dict[str, list[int]]):
    """`estimate_sizes` for every tensor of a loaded model, computed once per
    shapes (shape inference on a big model costs seconds; the baseline and the
    determinism run both need it)."""
    memo = info.__dict__.setdefault("_sizes_memo", {})
    key = repr(sorted(shapes.items()))
    if key not in memo:
        memo[key] = estimate_sizes(info.model, shapes, info.index.intermediate_tensors())
    return memo[key]


def plan_groups(
    tensors: list[str], sizes: dict[str, Optional[int]], budget: int
) -> list[list[str]]:
    """Greedy split in topological order; unknown sizes count as the largest known."""
    known = [s for s in sizes.values() if s]
    fallback = max(known) if known else 4 * MB
    groups: list[list[str]] = []
    cur: list[str] = []
    used = 0
    for t in tensors:
        s = sizes.get(t) or fallback
        if cur and used + s > budget:
            groups.append(cur)
            cur, used = [], 0
        cur.append(t)
        used += s
    if cur:
        groups.append(cur)
    return groups


def _libc_trim():
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


_TRIM = _libc_trim()


# below this a group's arrays are too small for a trim to give anything back
RELEASE_AFTER_BYTES = 32 << 20


def release_memory() -> None:
    """Give freed activations back to the OS between groups.

    glibc raises its mmap threshold after large frees, so later 16 MB
    tensors land on the heap and stay resident after being freed; without a
    trim the process grows by a group's worth over the budget."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


class Sink(Protocol):
    def write(self, tensor: str, sample: int, array: np.ndarray) -> None: ...

    def end(self, tensor: str) -> None: ...


@dataclass
class GroupRun:
    groups: int
    tensors: int
    skipped: list[str]  # tensors ORT could not return as arrays (sequences, maps)


NO_SPIN = ("session.intra_op.allow_spinning", "0")


def make_session(model: onnx.ModelProto, level: str = "disable", threads: int = 0):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    so.enable_cpu_mem_arena = False  # let freed activations go back to the OS
    # ORT's pool threads spin after each parallel op by default: CPU taken from the
    # builds and the Python this tool runs beside its sessions (a tenth to a fifth of
    # the wall time of a bisection on two cores); values do not depend on it
    so.add_session_config_entry(NO_SPIN[0], NO_SPIN[1])
    if threads:
        so.intra_op_num_threads = threads
    quiet_ort()
    so.log_severity_level = ORT_QUIET
    try:
        if model.ByteSize() < PROTO_LIMIT:
            return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        # A protobuf message cannot exceed 2 GB: weights go to an external file.
        import tempfile

        with tempfile.TemporaryDirectory(prefix="bisect_tui_big_") as tmp:
            path = f"{tmp}/model.onnx"
            onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                            location="model.onnx.data")
            return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = log_engine_error("ONNX Runtime could not load the model", exc)
        raise UserError(f"ONNX Runtime could not load the model: {msg[:300]}{where}") from None


def guessed_inputs_hint(inputs: InputSet) -> str:
    """When the run fails, point at the inputs whose values were guessed: random
    integers (a sample rate, a length) are the usual reason a real model refuses."""
    how = inputs.source.get("how") or {}
    guessed = [n for n, a in inputs.arrays.items()
               if a.dtype.kind in "iub" and "random" in how.get(n, "") and "mask" not in how.get(n, "")]
    if not guessed:
        return ""
    return ("; the values of " + ", ".join(f"'{n}'" for n in guessed) + " were random guesses: give real ones "
            "with " + " ".join(f"--input-value {n}=VALUE" for n in guessed) + " or --input FILE.npz")


def run_groups(
    model: onnx.ModelProto,
    groups: list[list[str]],
    inputs: InputSet,
    sink: Sink,
    types: Optional[dict[str, onnx.TypeProto]] = None,
    cancel: Optional[CancelToken] = None,
    progress: ProgressFn = no_progress,
    stage: str = "baseline",
    on_group_done: Optional[Callable[[int, list[str]], None]] = None,
    last_session: Optional[Callable[[Any], None]] = None,
) -> GroupRun:
    """Run each group in a fresh ORT_DISABLE_ALL session and stream arrays to `sink`.

    `last_session`: called with the last group's session before it goes (another
    run on the same unfused model, without a session of its own)."""
    cancel = cancel or CancelToken()
    total = sum(len(g) for g in groups)
    done = 0
    skipped: list[str] = []
    held = 0  # bytes of arrays the group returned
    for gi, group in enumerate(groups):
        cancel.check()
        # no types given: marked without one, and ORT types each output at session
        # creation from the node that makes it (shape inference of a 2,000-node
        # graph only for that cost 0.05 s)
        marked = mark_outputs(model, group, types=types if types is not None else {}, keep_original=False)
        sess = make_session(marked)
        names = [o.name for o in sess.get_outputs()]
        for k in range(inputs.samples):
            cancel.check()
            try:
                values = sess.run(names, inputs.feeds(k))
            except Exception as exc:
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                where = log_engine_error("ONNX Runtime failed to run the model", exc)
                raise UserError(f"ONNX Runtime failed to run the model: {msg[:300]}"
                                f"{guessed_inputs_hint(inputs)}{where}") from None
            for name, value in zip(names, values):
                if isinstance(value, np.ndarray):
                    sink.write(name, k, value)
                    held += value.nbytes
                elif k == 0:
                    skipped.append(name)
            del values
        for name in names:
            if name not in skipped:
                sink.end(name)
        end_group = getattr(sink, "end_group", None)  # a sink that writes per group (baseline packs)
        if end_group is not None:
            end_group()
        if last_session is not None and gi == len(groups) - 1:
            last_session(sess)
        del sess, marked
        if held >= RELEASE_AFTER_BYTES:  # a full collection costs 40 ms on a 5,000-node model
            release_memory()
        held = 0
        done += len(group)
        if on_group_done:
            on_group_done(gi, group)
        progress(
            Progress(
                stage,
                f"group {gi + 1}/{len(groups)}",
                done,
                total,
                {"group": gi + 1, "groups": len(groups)},
            )
        )
    return GroupRun(len(groups), total, skipped)
