"""Checks on the baseline itself: is it deterministic, and are its values sane?

A baseline that changes between two runs, or already holds NaN/Inf, cannot
judge anything else: these checks run before any fused engine is built.
"""

from __future__ import annotations

import fnmatch
import math
import time
from typing import TYPE_CHECKING, Optional

import numpy as np

from bisect_tui.core.baseline_store import manifest_index
from bisect_tui.core.cancel import CancelToken, ProgressFn, no_progress
from bisect_tui.core.errors import UserError
from bisect_tui.core.groups import model_sizes, open_session, plan_groups
from bisect_tui.core.inputs import InputSet
from bisect_tui.core.memory import FRESH_PROCESS_FLOOR, activation_budget, weight_copies
from bisect_tui.core.model import ModelInfo
from bisect_tui.core.second_run import SecondRun
from bisect_tui.core.session import Session, now_iso
from bisect_tui.core.stats import BF16_MAX, FP16_MAX

if TYPE_CHECKING:
    from bisect_tui.api.reference import UnfusedReference


def determinism_plan(info: ModelInfo, shapes: dict[str, list[int]], tensors: list[str],
                     max_memory: int) -> list[list[str]]:
    """The second run's groups: the baseline's memory budget, in the fresh process
    that runs them. This process's own size does not count: an app that had grown
    past `max_memory` planned one tensor per group there (2,404 fresh sessions, 4
    minutes on a 2-core machine, instead of one group and a second)."""
    sizes, _ = model_sizes(info, shapes)
    return plan_groups(tensors, sizes, activation_budget(max_memory, info.initializer_bytes, sizes,
                                                         weight_copies(info), floor=FRESH_PROCESS_FLOOR))


def check_determinism(
    info: ModelInfo,
    session: Session,
    inputs: InputSet,
    shapes: dict[str, list[int]],
    manifest: dict,
    max_memory: int,
    cancel: Optional[CancelToken] = None,
    progress: ProgressFn = no_progress,
    started: Optional[SecondRun] = None,
    *,
    reference: "UnfusedReference",
    cuts: tuple[str, ...] = (),
) -> dict:
    """Run the baseline again on `reference`, in fresh sessions of a fresh process,
    and compare every tensor bit for bit.

    `started`: the same second run begun earlier (while the baseline dumped),
    used when it planned exactly this manifest's tensors. `cuts`: where a second run
    made here may cut the graph into parts (core/parted_run.py)."""
    key = manifest["key"]
    cached = session.read_json("determinism.json")
    if cached and cached.get("baseline_key") == key:
        if started is not None:
            started.abort()
        return cached
    t0 = time.perf_counter()
    tensors = [e["tensor"] for e in manifest["tensors"]]
    groups = determinism_plan(info, shapes, tensors, max_memory)
    if started is not None and [sorted(g) for g in started.groups] != [sorted(g) for g in groups]:
        started.abort()
        started = None
    run = started or SecondRun(session, groups, cancel, reference=reference, cuts=cuts)
    digests = run.collect(progress)
    idx = manifest_index(manifest)

    def differing_from(digests: dict) -> list[dict]:
        return [{"tensor": t, "node": idx[t]["node"], "op_type": idx[t]["op_type"], "index": idx[t]["index"]}
                for t in tensors if digests.get(t) != idx[t]["sha256"]]

    differing = differing_from(digests)
    second: dict = {"parts": run.parts} if run.parts else {}
    if differing and run.parts:
        # the parts or the runs: a second run in one session, as the dump was made, tells
        second["parts_differed"] = differing[0]["tensor"]
        again = SecondRun(session, groups, cancel, reference=reference)
        differing = differing_from(again.collect(progress))
    elif run.parts:
        second["control"] = "every tensor bit-identical to the dump's one session"
    result = {
        "baseline_key": key,
        "checked_at": now_iso(),
        "tensors_compared": len(tensors),
        "deterministic": not differing,
        "differing": differing,
        "first": differing[0] if differing else None,
        "seconds": time.perf_counter() - t0,
        "overlapped": started is not None,
        **({"second_run": second} if second else {}),
    }
    if differing:
        first = differing[0]
        result["advice"] = (
            f"'{first['tensor']}' (node {first['node']}, {first['op_type']}) differs between two "
            "identical runs: a comparison cannot separate fusion error from run-to-run noise. "
            "Look for random ops (Dropout in training mode, RandomNormal), uninitialised memory, "
            "or thread-count dependent reductions; fix or pin them before comparing engines."
        )
    session.write_json("determinism.json", result)
    return result


def parse_ranges(items) -> list[tuple[str, float, float]]:
    """`--range 'attn*=-1e4:1e4'` -> [(pattern, lo, hi)]; patterns match tensor names."""
    out = []
    for item in items or ():
        try:
            pat, rng = item.rsplit("=", 1)
            lo, hi = rng.split(":", 1)
            out.append((pat.strip(), float(lo), float(hi)))
        except ValueError:
            raise UserError(f"bad --range {item!r}: expected TENSOR_OR_GLOB=MIN:MAX") from None
    return out


def check_ranges(
    info: ModelInfo,
    manifest: dict,
    user_ranges: Optional[list[tuple[str, float, float]]] = None,
    underflow_share: float = 0.01,
    session: Optional[Session] = None,
) -> dict:
    """NaN/Inf (and where they start), FP16/BF16 headroom, user ranges: from manifest stats."""
    idx = manifest_index(manifest)
    nonfinite = []
    for e in manifest["tensors"]:
        st = e["stats"]
        if st["nan"] or st["inf"]:
            nonfinite.append(
                {"tensor": e["tensor"], "node": e["node"], "op_type": e["op_type"],
                 "nan": st["nan"], "inf": st["inf"], "numel": st["numel"]}
            )
    origin = None
    if nonfinite:
        inits = {t.name: t for t in info.model.graph.initializer}
        for bad in nonfinite:
            node = info.index.by_name[bad["node"]]
            inputs_finite = True
            for i in node.input:
                if not i:
                    continue
                if i in idx:
                    st = idx[i]["stats"]
                    inputs_finite &= not (st["nan"] or st["inf"])
                elif i in inits:
                    from bisect_tui.core.external_data import tensor_array

                    arr = tensor_array(inits[i])
                    if arr.dtype.kind == "f":
                        inputs_finite &= bool(np.isfinite(arr).all())
            if inputs_finite:
                origin = {
                    **bad,
                    "inputs": [i for i in node.input if i],
                    "advice": (
                        f"{bad['op_type']} node '{bad['node']}' turns finite inputs into "
                        f"{'NaN' if bad['nan'] else 'Inf'}: check its inputs' ranges (division by "
                        "zero, log/sqrt of negatives, exp overflow) before comparing engines."
                    ),
                }
                break

    def headroom(limit: float, over_key: str, under_key: str, label: str) -> dict:
        overflow, near, underflow = [], [], []
        for e in manifest["tensors"]:
            st = e["stats"]
            if e["dtype"] not in ("float32", "float64"):
                continue
            amax = st["abs_max"]
            room = (limit / amax) if amax else math.inf
            row = {"tensor": e["tensor"], "node": e["node"], "op_type": e["op_type"],
                   "abs_max": amax, "headroom": room}
            if st[over_key]:
                overflow.append({**row, "count": st[over_key]})
            elif room < 4:
                near.append(row)
            nonzero = max(st["finite"] - st["zeros"], 1)
            share = st[under_key] / nonzero
            if share > underflow_share:
                underflow.append({**row, "share": share, "count": st[under_key]})
        worst = min(
            (r for r in overflow + near), key=lambda r: r["headroom"], default=None
        )
        return {"type": label, "max": limit, "overflow": overflow, "near_overflow": near,
                "underflow": underflow, "tightest": worst}

    fp16 = headroom(FP16_MAX, "fp16_overflow", "fp16_underflow", "float16")
    bf16 = headroom(BF16_MAX, "bf16_overflow", "bf16_underflow", "bfloat16")

    violations = []
    for pat, lo, hi in user_ranges or []:
        matched = [e for e in manifest["tensors"] if fnmatch.fnmatchcase(e["tensor"], pat)]
        if not matched:
            raise UserError(f"--range pattern {pat!r} matches no tensor of the model")
        for e in matched:
            st = e["stats"]
            if st["min"] is None:
                continue
            if st["min"] < lo or st["max"] > hi:
                violations.append({"tensor": e["tensor"], "node": e["node"], "min": st["min"],
                                   "max": st["max"], "range": [lo, hi]})
    result = {
        "baseline_key": manifest["key"],
        "nan_inf": nonfinite,
        "nan_inf_origin": origin,
        "fp16": fp16,
        "bf16": bf16,
        "user_ranges": violations,
        "ok": not nonfinite and not violations,
    }
    if session is not None:
        session.write_json("range_check.json", result)
    return result


def perturbed_runs(reference: "UnfusedReference", model, inputs: InputSet, session=None,
                   outputs: Optional[list[str]] = None) -> Optional[list[dict[str, np.ndarray]]]:
    """The unfused FP32 outputs, per sample, with every float input moved by one ulp
    in a random (seeded) direction; None when no input is floating point. Needs
    the model and inputs only, so it may run beside the baseline dump in a session
    of `reference`, or in the dump's own last session (`session`, which marks more
    tensors: the same unfused kernels) for the graph `outputs`; None when that
    session lacks one."""
    if not any(a.dtype.kind == "f" for a in inputs.arrays.values()):
        return None
    if session is not None:
        have = set(session.output_names())
        if not outputs or any(o not in have for o in outputs):
            return None
    rng = np.random.default_rng(12345)
    feeds_all = {}
    for name, arr in inputs.arrays.items():
        if arr.dtype.kind == "f":
            toward = np.where(rng.random(arr.shape) < 0.5, -np.inf, np.inf).astype(arr.dtype)
            feeds_all[name] = np.nextafter(arr, toward)
        else:
            feeds_all[name] = arr
    sess = session if session is not None else open_session(reference, model)
    names = list(outputs) if session is not None else sess.output_names()
    return [dict(zip(names, sess.run(names, {n: np.asarray(a[k], order="C") for n, a in feeds_all.items()})))
            for k in range(inputs.samples)]


def check_sensitivity(info: ModelInfo, session: Session, inputs: InputSet, manifest: dict,
                      tolerance, key: str, runs: Optional[list] = None, *,
                      reference: "UnfusedReference") -> dict:
    """How far the unfused FP32 outputs move when every float input moves by one ulp.

    A fused kernel that only reorders FP32 arithmetic perturbs activations by
    about that much. If the model amplifies such noise beyond the tolerance,
    *every* fusion will look guilty; the search and its isolated evidence must
    then be read with that in mind. `runs`: perturbed_runs, made earlier (else
    made now on `reference`)."""
    cached = session.read_json("sensitivity.json")
    if cached and cached.get("key") == key:
        return cached
    from bisect_tui.core.baseline_store import reference_output
    from bisect_tui.core.tolerance import judge_arrays

    if not any(a.dtype.kind == "f" for a in inputs.arrays.values()):
        result = {"key": key, "skipped": "no floating-point input to perturb"}
        session.write_json("sensitivity.json", result)
        return result
    if runs is None:
        runs = perturbed_runs(reference, info.model, inputs)
    names = list(runs[0]) if runs else []
    outputs = {}
    for name in names:
        ref = reference_output(info, session, manifest, inputs, name)
        metrics, verdict = judge_arrays(ref, np.stack([r[name] for r in runs]), tolerance.for_output(name))
        outputs[name] = {"max_abs": metrics["max_abs"], "ratio": verdict.ratio, "passed": verdict.passed}
    worst = max((o["ratio"] for o in outputs.values()), default=0.0)
    result = {
        "key": key,
        "perturbation": "every float input moved by 1 ulp (random direction)",
        "outputs": outputs,
        "ratio": worst,
        "amplifies": worst > 1,
    }
    if worst > 1:
        result["advice"] = (
            f"a 1-ulp change of the inputs moves the unfused FP32 outputs to {worst:.3g}x the tolerance: "
            "the model amplifies rounding noise, so fused kernels that merely reorder FP32 arithmetic "
            "break this tolerance too. Loosen the tolerance, or judge culprits by their isolated "
            "evidence (fused vs float64 truth)."
        )
    session.write_json("sensitivity.json", result)
    return result
