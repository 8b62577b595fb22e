"""The FP32 baseline: every intermediate tensor of the unfused model, on disk.

The unfused reference the triage is handed (FP32, nothing fused), every
top-level tensor marked (in memory-bounded groups, see groups.py). One `.npy`
per tensor, named `layer_{index:04d}_{op}_{tensor}.npy` where index is the
producing node's topological position, with a leading samples axis (in a
model with thousands of tensors the small ones are members of one `.npz` per
group under the same names, see baseline_pack.py). `manifest.json` is written
last; `manifest.partial.json` after each group lets an interrupted dump resume.

The parts around the dump: the writer (baseline_writer.py), the manifest
checks (baseline_manifest.py), the read side (baseline_store.py) and the
budget (memory.py). Their names most callers want are importable from here.
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import numpy as np
import onnx

from bisect_tui import __version__
from bisect_tui.core import atomic, baseline_pack
from bisect_tui.core.baseline_manifest import check_manifest, entry_problem, load_manifest  # noqa: F401
from bisect_tui.core.baseline_store import (  # noqa: F401  (the read side, where callers import it)
    REMEMBER_BASELINE_BYTES,
    load_tensor,
    manifest_index,
    reference_output,
)
from bisect_tui.core.baseline_writer import NpySink, flush_to_disk
from bisect_tui.core.cancel import CancelToken, Progress, ProgressFn, no_progress
from bisect_tui.core.graph import safe_name
from bisect_tui.core.groups import model_sizes, plan_groups, run_groups
from bisect_tui.core.inputs import InputSet
from bisect_tui.core.memory import (
    MB,
    RUN_ALLOWANCE,
    activation_budget,
    weight_copies,
    memory_budget_warning,
    process_floor,
)
from bisect_tui.core.model import ModelInfo
from bisect_tui.core.session import Session, now_iso, stable_key

if TYPE_CHECKING:
    from bisect_tui.api.reference import UnfusedReference


def inputs_sha(inputs: InputSet) -> str:
    h = hashlib.sha256()
    for name in sorted(inputs.arrays):
        a = np.ascontiguousarray(inputs.arrays[name])
        h.update(name.encode())
        h.update(a.dtype.str.encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _platform_name() -> str:
    """platform.platform()'s words ("Linux-6.1.0-x86_64-with-glibc2.36") without its
    walk of uname() that asks for the processor, which forks `uname -p` (_cpu_name)."""
    u = platform.uname()  # its processor is read lazily: not here
    libc = "".join(platform.libc_ver())
    return "-".join(x for x in (u.system, u.release, u.machine) if x) + (f"-with-{libc}" if libc else "")


def _cpu_name() -> str:
    """The CPU's model as Linux names it, else the machine type: platform.processor()
    forks `uname -p` on Linux, a copy of a process holding the dump at its peak (a
    memory sampler read the pair as twice the process) for a word that says "unknown"."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name") and ":" in line:
                    return line.split(":", 1)[1].strip() or platform.machine()
    except OSError:
        pass
    return platform.machine()


def versions(reference: "UnfusedReference") -> dict:
    """What produced a baseline: this tool, the reference's own libraries, the machine."""
    try:
        import psutil

        mem = psutil.virtual_memory().total
    except Exception:
        mem = None
    return {
        "bisect_tui": __version__,
        **reference.versions(),
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": _platform_name(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": mem,
    }


def file_names(info: ModelInfo, tensors: list[str]) -> dict[str, str]:
    """`layer_{index:04d}_{op}_{tensor}.npy`, unique even after making names safe.

    The index's maps are read into locals and each op type made safe once: per
    tensor there is then one safe name to make and a set to check (a 21,000-tensor
    model asked for its op types' safe names 21,000 times)."""
    names: dict[str, str] = {}
    used: set[str] = set()
    producer, by_name, order = info.index.producer, info.index.by_name, info.index.order
    ops: dict[str, str] = {}
    for t in tensors:
        node = by_name[producer[t]]
        idx = order[node.name]
        op = node.op_type
        safe_op = ops.get(op)
        if safe_op is None:
            safe_op = ops[op] = safe_name(op, 24)
        base = f"layer_{idx:04d}_{safe_op}_{safe_name(t)}"
        fname = base + ".npy"
        low = fname.lower()
        if low in used:
            k = 1
            # compared case-folded: on macOS/Windows `A` and `a` are one file
            while low in used:
                fname = f"{base}_{k}.npy"
                low = fname.lower()
                k += 1
        used.add(low)
        names[t] = fname
    return names


@dataclass
class BaselineResult:
    manifest: dict
    reused: bool
    seconds: float
    # tensors whose file on disk did not match its manifest digest: recomputed
    recomputed: list = field(default_factory=list)


def baseline_key(info: ModelInfo, inputs: InputSet, reference: "UnfusedReference") -> str:
    return stable_key("baseline/v1", info.sha256, inputs_sha(inputs), reference.cache_key())


def run_baseline(
    info: ModelInfo,
    session: Session,
    inputs: InputSet,
    shapes: dict[str, list[int]],
    max_memory: int,
    cancel: Optional[CancelToken] = None,
    progress: ProgressFn = no_progress,
    last_session=None,
    *,
    reference: "UnfusedReference",
) -> BaselineResult:
    """Dump every intermediate tensor of `reference`'s run; reuse a valid earlier
    dump (or its finished part).

    `last_session`: given the dump's last session before it goes (groups.run_groups)."""
    t0 = time.perf_counter()
    key = baseline_key(info, inputs, reference)
    outdir = session.baseline_dir
    tensors = info.index.intermediate_tensors()
    fnames = file_names(info, tensors)
    done: dict[str, dict] = {}
    recomputed: list[dict] = []
    # A finished dump, else the finished part of an interrupted one: every file
    # is checked against the digest written with it before it is trusted.
    for rel in ("baseline/manifest.json", "baseline/manifest.partial.json"):
        m, good, bad = check_manifest(session, session.read_json(rel))
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
    act_budget = activation_budget(max_memory, info.initializer_bytes, sizes, weight_copies(info))
    groups = plan_groups(todo, sizes, act_budget)
    floor = process_floor()
    largest = max((v for v in sizes.values() if v), default=0)
    memory_warning = memory_budget_warning(
        max_memory, floor, floor + RUN_ALLOWANCE + weight_copies(info) * info.initializer_bytes + 2 * largest, largest
    ) if todo else ""
    if memory_warning:
        progress(Progress("baseline", "warning: " + memory_warning, 0, None, {"warning": memory_warning}))
    written = {"bytes": sum(e["bytes"] for e in done.values())}

    producer, by_name, positions = info.index.producer, info.index.by_name, info.index.order

    def entry(t: str, meta: dict) -> dict:
        node = by_name[producer[t]]
        name = node.name
        return {
            "tensor": t,
            "node": name,
            "op_type": node.op_type,
            "index": positions[name],
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
    order = {t: positions[producer[t]] for t in todo} if pack else None
    sink = NpySink(outdir, fnames, inputs.samples, on_done, remember=small, pack=pack, order=order)
    progress(Progress("baseline", f"{len(tensors)} tensors in {len(groups)} group(s)", len(done), len(tensors)))
    try:
        run_groups(
            reference, info.model, groups, inputs, sink, types, cancel, relay, "baseline", write_partial,
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
            **reference.settings(),
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
    atomic.write_json(outdir / "run.json", {"versions": versions(reference), "seconds": time.perf_counter() - t0})
    flush_to_disk(outdir)  # the tensors' bytes on disk before the manifest says they are there
    atomic.write_json(session.manifest_path, manifest, compact=True)  # last: marks the dump complete
    try:
        (outdir / "manifest.partial.json").unlink()
    except FileNotFoundError:
        pass
    if recomputed:
        manifest["recomputed"] = recomputed
    return BaselineResult(manifest, False, time.perf_counter() - t0, recomputed)

