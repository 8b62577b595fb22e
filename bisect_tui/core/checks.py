"""Checks on the baseline itself: is it deterministic, and are its values sane?

A baseline that changes between two runs, or already holds NaN/Inf, cannot
judge anything else: these checks run before any fused engine is built.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import queue
import time
from pathlib import Path
from typing import Optional

import numpy as np

from bisect_tui.core.baseline import activation_budget, manifest_index
from bisect_tui.core.cancel import CancelToken, Progress, ProgressFn, no_progress
from bisect_tui.core.errors import UserError
from bisect_tui.core.inputs import InputSet
from bisect_tui.core.model import ModelInfo
from bisect_tui.core.groups import model_sizes, plan_groups
from bisect_tui.core.session import Session, now_iso
from bisect_tui.core.stats import BF16_MAX, FP16_MAX


class HashSink:
    """SHA-256 of each tensor over all samples, the digest the manifest records."""

    def __init__(self):
        self.hashes: dict[str, "hashlib._Hash"] = {}
        self.digests: dict[str, str] = {}

    def write(self, tensor: str, sample: int, array: np.ndarray) -> None:
        self.hashes.setdefault(tensor, hashlib.sha256()).update(
            np.ascontiguousarray(array).tobytes()
        )

    def end(self, tensor: str) -> None:
        self.digests[tensor] = self.hashes.pop(tensor).hexdigest()


def determinism_plan(info: ModelInfo, shapes: dict[str, list[int]], tensors: list[str],
                     max_memory: int) -> list[list[str]]:
    """The second run's groups: the same memory budget as the baseline's."""
    sizes, _ = model_sizes(info, shapes)
    return plan_groups(tensors, sizes, activation_budget(max_memory, info.initializer_bytes, sizes))


def check_determinism(
    info: ModelInfo,
    session: Session,
    inputs: InputSet,
    shapes: dict[str, list[int]],
    manifest: dict,
    max_memory: int,
    cancel: Optional[CancelToken] = None,
    progress: ProgressFn = no_progress,
    started: Optional["SecondRun"] = None,
) -> dict:
    """Run the baseline again in fresh sessions and compare every tensor bit for bit.

    `started`: the same second run begun earlier (while the baseline dumped),
    used when it planned exactly this manifest's tensors."""
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
    run = started or SecondRun(session, groups, cancel)
    digests = run.collect(progress)
    idx = manifest_index(manifest)
    differing = []
    for t in tensors:
        if digests.get(t) != idx[t]["sha256"]:
            e = idx[t]
            differing.append({"tensor": t, "node": e["node"], "op_type": e["op_type"], "index": e["index"]})
    result = {
        "baseline_key": key,
        "checked_at": now_iso(),
        "tensors_compared": len(tensors),
        "deterministic": not differing,
        "differing": differing,
        "first": differing[0] if differing else None,
        "seconds": time.perf_counter() - t0,
        "overlapped": started is not None,
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


class SecondRun:
    """The baseline's groups run again in a new Python process (see
    second_run.py), which prints every tensor's SHA-256.

    It needs nothing from the first run, so it may start before the baseline
    dump and run beside it on another core; `collect` waits for its digests.
    Cancellable at any time; errors are one line."""

    def __init__(self, session: Session, groups: list[list[str]], cancel: Optional[CancelToken],
                 truth_outputs: Optional[list[str]] = None):
        """`truth_outputs`: after the digests, the child also runs the model in
        float64 (the arbiter's truth, which needs nothing from the engine) for these
        graph outputs, on its own core while this process judges the engine;
        `truth()` reads it."""
        import atexit
        import json
        import os
        import subprocess
        import sys
        import tempfile
        import threading

        from bisect_tui.core import atomic

        self.groups = groups
        self.cancel = cancel or CancelToken()
        tmp_dir = session.path("tmp")
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, self.plan_path = tempfile.mkstemp(prefix="determinism-plan-", suffix=".json", dir=tmp_dir)
        os.close(fd)
        self.truth_path = self.plan_path[: -len(".json")] + ".truth.npz"
        self.truth_outputs = list(truth_outputs) if truth_outputs else None
        plan: dict = {"groups": groups}  # the session holds the model and the exact inputs
        if self.truth_outputs:
            plan["truth"] = {"outputs": self.truth_outputs, "file": self.truth_path}
        atomic.write_json(Path(self.plan_path), plan)
        from bisect_tui.core.second_run import child_env, take_prestarted

        cmd = [sys.executable, "-m", "bisect_tui.core.second_run", str(session.root), self.plan_path]
        try:
            waiting = take_prestarted()
            if waiting is not None:
                try:  # the interpreter started at launch: hand it this run
                    assert waiting.stdin is not None
                    waiting.stdin.write(json.dumps(cmd[-2:]) + "\n")
                    waiting.stdin.close()
                except (OSError, ValueError):
                    waiting.kill()
                    waiting.wait()
                    waiting = None
            self.proc = waiting or subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                    text=True, stdin=subprocess.DEVNULL, env=child_env())
        except BaseException:
            self._unlink_plan()
            raise
        self._done = False
        # both pipes are drained from the start: a child started early must never
        # block on a full pipe while this process is still dumping
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.stderr_parts: list[str] = []

        def read_out() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.put(line)
            self.lines.put(None)

        def read_err() -> None:
            assert self.proc.stderr is not None
            self.stderr_parts.append(self.proc.stderr.read())

        def watch() -> None:  # a cancel stops the child even while it is silent
            while self.proc.poll() is None and not self._done:
                if self.cancel.cancelled:
                    self.proc.kill()
                    return
                time.sleep(0.05)

        atexit.register(self.abort)  # never an orphan, whatever stops this process
        self._readers = [threading.Thread(target=f, daemon=True) for f in (read_out, read_err)]
        for t in self._readers:
            t.start()
        threading.Thread(target=watch, daemon=True).start()

    def _unlink_plan(self) -> None:
        import os

        for f in (self.plan_path, self.truth_path):
            try:
                os.unlink(f)
            except OSError:
                pass

    @property
    def truth_pending(self) -> bool:
        """The digests are in and the child is still working on the float64 truth."""
        return bool(self.truth_outputs) and not self._done

    def _next_message(self) -> Optional[dict]:
        """The child's next JSON line (None at its end or on cancel)."""
        import json

        while True:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.cancel.cancelled:
                    return None
                continue
            if line is None or self.cancel.cancelled:
                return None
            try:
                return json.loads(line)
            except ValueError:
                continue

    def truth(self) -> Optional[tuple[dict, Optional[str], Optional[str]]]:
        """(arrays by output name, what computed them, why the first evaluator did not)
        from the child; None when it gave none (it died: the caller computes it).
        A model with no float64 truth raises the child's one-line UserError."""
        if not self.truth_pending:
            return None
        msg = None
        try:
            while msg is None:
                m = self._next_message()
                if m is None:
                    break
                if "truth" in m or "truth_error" in m:
                    msg = m
            arrays = None
            if msg is not None and "truth" in msg:
                try:
                    with np.load(self.truth_path, allow_pickle=False) as z:
                        arrays = {n: z[f"o{i}"] for i, n in enumerate(self.truth_outputs or [])}
                except (OSError, ValueError, KeyError):
                    msg = None  # the file did not survive (a sweep, a full disk): computed here
        finally:
            self._end(kill=msg is None)
        self.cancel.check()
        if msg is None:
            return None
        if "truth_error" in msg:
            raise UserError(msg["truth_error"])
        return arrays, msg["truth"].get("ran_with"), msg["truth"].get("fallback_reason")

    def abort(self) -> None:
        """Not needed after all (or the run around it failed): stop the child."""
        if not self._done:
            self._end(kill=True)

    def _end(self, kill: bool) -> str:
        """Done with the child: stopped first when `kill` (it still owes something
        nobody will read), then reaped; its stderr."""
        import atexit

        self._done = True
        atexit.unregister(self.abort)
        if kill and self.proc.poll() is None:
            self.proc.kill()
        return self._finish()

    def _finish(self) -> str:
        self.proc.wait()
        for t in self._readers:
            t.join(timeout=10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        self._unlink_plan()
        return "".join(self.stderr_parts)

    def collect(self, progress: ProgressFn = no_progress) -> dict[str, str]:
        digests: Optional[dict] = None
        error = None
        stderr = ""
        try:
            while True:
                msg = self._next_message()
                if msg is None:
                    break
                if "progress" in msg:
                    progress(Progress("determinism", f"second run (fresh process): {msg['progress']}",
                                      msg.get("done", 0), msg.get("total", 0)))
                elif "digests" in msg:
                    digests = msg["digests"]
                    if self.truth_outputs:
                        break  # the child goes on with the float64 truth: truth() reads it
                elif "error" in msg:
                    error = msg["error"]
        finally:
            keep = digests is not None and bool(self.truth_outputs) and not self.cancel.cancelled
            if not keep:
                stderr = self._end(kill=self.cancel.cancelled or digests is None)
        self.cancel.check()
        if error:
            raise UserError(error)
        if digests is None:
            last = (stderr or "").strip().splitlines()
            raise RuntimeError("the determinism check's second run (a fresh process) failed: "
                               + (last[-1] if last else f"exit code {self.proc.returncode}"))
        return digests


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
                    from onnx import numpy_helper

                    arr = numpy_helper.to_array(inits[i])
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


def perturbed_runs(model, inputs: InputSet, session=None,
                   outputs: Optional[list[str]] = None) -> Optional[list[dict[str, np.ndarray]]]:
    """The unfused FP32 outputs, per sample, with every float input moved by one ulp
    in a random (seeded) direction; None when no input is floating point. Needs
    the model and inputs only, so it may run beside the baseline dump, or in the
    dump's own last session (`session`, which marks more tensors: the same kernels
    at ORT_DISABLE_ALL) for the graph `outputs`; None when that session lacks one."""
    from bisect_tui.engines.ort.unfused import make_session

    if not any(a.dtype.kind == "f" for a in inputs.arrays.values()):
        return None
    if session is not None:
        have = {o.name for o in session.get_outputs()}
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
    sess = session if session is not None else make_session(model, "disable")
    names = list(outputs) if session is not None else [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(names, {n: np.asarray(a[k], order="C") for n, a in feeds_all.items()})))
            for k in range(inputs.samples)]


def check_sensitivity(info: ModelInfo, session: Session, inputs: InputSet, manifest: dict,
                      tolerance, key: str, runs: Optional[list] = None) -> dict:
    """How far the unfused FP32 outputs move when every float input moves by one ulp.

    A fused kernel that only reorders FP32 arithmetic perturbs activations by
    about that much. If the model amplifies such noise beyond the tolerance,
    *every* fusion will look guilty; the search and its isolated evidence must
    then be read with that in mind. `runs`: perturbed_runs, made earlier."""
    cached = session.read_json("sensitivity.json")
    if cached and cached.get("key") == key:
        return cached
    from bisect_tui.core.baseline import reference_output
    from bisect_tui.core.tolerance import judge_arrays

    if not any(a.dtype.kind == "f" for a in inputs.arrays.values()):
        result = {"key": key, "skipped": "no floating-point input to perturb"}
        session.write_json("sensitivity.json", result)
        return result
    if runs is None:
        runs = perturbed_runs(info.model, inputs)
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
