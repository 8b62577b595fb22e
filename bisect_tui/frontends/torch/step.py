"""The torch front end inside the triage: export before, golden data after the baseline.

`prepare` runs before the checklist's first step: it calls the factory, checks
the session is this model's, exports (or reuses a verified earlier export) and
fixes the inputs. `run_golden` runs after the ONNX baseline: forward hooks
twice, the cross-check, the pitfalls. `float64_truth` gives the arbiter
PyTorch's own float64 result. Everything lands under `<session>/torch/`:

    torch/export.json        exporter used, digests of weights, inputs and exported model
    torch/exported.onnx      the export (the session's model.onnx is prepared from it)
    torch/example_inputs.npz the factory's example inputs, written once
    torch/golden/            layer_<index>_<module path>.npy, manifest.json (last)
    torch/crosscheck.json    module outputs vs ONNX tensors, coverage, pitfalls
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from bisect_tui.core import atomic
from bisect_tui.core.errors import UserError
from bisect_tui.core.escape import safe_filename
from bisect_tui.core.model import file_sha256
from bisect_tui.core.session import Session, now_iso, stable_key
from bisect_tui.frontends.torch import TorchSpec, factory, pitfalls
from bisect_tui.frontends.torch.export import export
from bisect_tui.frontends.torch.hooks import flatten_tensors, load_golden, run_recorded, write_manifest

TORCH_DIR = "torch"


def default_session_dir(spec: TorchSpec, base: Optional[Path] = None) -> Path:
    """Named after the spec, not the export's hash: a factory that gives other
    weights on every call then lands in the same session and is caught there."""
    base = Path(base) if base else Path.cwd() / "bisect-sessions"
    digest = hashlib.sha256(spec.text.encode()).hexdigest()[:8]
    return base / f"torch-{safe_filename(spec.factory, max_len=40)}-{digest}"


@dataclass
class TorchPrepared:
    spec: TorchSpec
    loaded: factory.Loaded
    root: Path
    model_path: Path
    input_file: Optional[Path]
    record: dict  # torch/export.json

    @property
    def dir(self) -> Path:
        return self.root / TORCH_DIR


def _trace_args(loaded: factory.Loaded, opts) -> tuple[tuple, str]:
    if loaded.example_inputs is not None:
        return loaded.example_inputs, "the factory's example inputs"
    if opts.input_file:
        p = Path(opts.input_file)
        try:
            with np.load(p, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files} if hasattr(z, "files") else {}
        except Exception as exc:
            raise UserError(f"cannot read --input {p}: {exc}") from None
        if not arrays and p.suffix == ".npy":
            arrays = {loaded.input_names[0]: np.load(p, allow_pickle=False)}
        feeds = {n: arrays[n] for n in loaded.input_names if n in arrays}
        return factory.feeds_to_args(loaded, feeds), f"the first arrays of {p.name}"
    missing = [n for n in loaded.input_names if n not in opts.shapes]
    if missing:
        raise UserError(
            "the factory returns a module without example inputs: give the input shape with "
            + " ".join(f"--shape {n}=DIMS" for n in missing) + " (or --input FILE, or return (module, inputs))")
    rng = np.random.default_rng(opts.seed)
    args = tuple(torch.from_numpy(rng.standard_normal(opts.shapes[n]).astype(np.float32))
                 for n in loaded.input_names)
    return args, f"random normal inputs of the --shape sizes (seed {opts.seed})"


def prepare(opts, root: Path) -> TorchPrepared:
    """Load, check against the session, export (or reuse), fix the inputs."""
    spec = TorchSpec.from_dict(opts.torch)
    session = Session(root)
    meta = session.meta()
    if meta:
        had = (meta.get("options") or {}).get("torch")
        if not had or had.get("spec") != spec.text:
            raise UserError(f"session {root} holds a triage of another model "
                            f"({(had or {}).get('spec') or meta.get('model_source')}); choose another --session")
    loaded = factory.load(spec)
    tdir = root / TORCH_DIR
    prev = session.read_json(f"{TORCH_DIR}/export.json") or {}
    if prev:
        if prev.get("state_sha256") != loaded.state_sha256:
            raise UserError(
                f"the weights changed since this session was made (state_dict SHA-256 "
                f"{prev.get('state_sha256', '')[:12]} then, {loaded.state_sha256[:12]} now): the factory does not "
                "load one checkpoint (unseeded random init?); seed it or load a file, or choose another --session")
        if prev.get("examples_sha256") != loaded.examples_sha256:
            raise UserError(
                "the factory's example inputs changed since this session was made: they are not fixed "
                "(torch.randn without a seed?); seed them or save them and pass --input, or choose another --session")
    exported = tdir / "exported.onnx"
    reuse = (prev and prev.get("exporter_requested") == spec.exporter and exported.exists()
             and prev.get("onnx_sha256") == file_sha256(exported)
             and prev.get("torch_version") == torch.__version__)
    if reuse:
        record = prev
    else:
        args, traced_with = _trace_args(loaded, opts)
        result = export(loaded, args, tdir, spec)
        second = factory.second_call(spec, loaded)
        record = {
            "spec": spec.text,
            "exporter_requested": spec.exporter,
            **result.to_dict(),
            "traced_with": traced_with,
            "onnx_sha256": file_sha256(exported),
            "state_sha256": loaded.state_sha256,
            "state_bytes": loaded.state_bytes,
            "examples_sha256": loaded.examples_sha256,
            "input_names": loaded.input_names,
            "training_at_load": loaded.training_at_load,
            "still_training": loaded.still_training,
            "dtype_changes": loaded.dtype_changes,
            "second_call": second,
            "exported_at": now_iso(),
        }
        atomic.write_json(tdir / "export.json", record)
    input_file = None
    if loaded.example_inputs is not None and not opts.input_file:
        input_file = tdir / "example_inputs.npz"
        if not input_file.exists():  # written once: its bytes are part of the session's input options
            atomic.save_npz(input_file, {n: t.numpy()[None] for n, t in zip(loaded.input_names,
                                                                              loaded.example_inputs)})
    return TorchPrepared(spec, loaded, root, exported, input_file, record)


def _train_vs_eval(loaded: factory.Loaded, args: tuple) -> Optional[float]:
    """How far training mode moves the output (buffers restored afterwards)."""
    if not any(m["changes_output"] for m in loaded.training_at_load):
        return None
    mod = loaded.module
    saved = {k: v.detach().clone() for k, v in mod.named_buffers()}
    torch.manual_seed(0)
    try:
        with torch.no_grad():
            ev = [t.detach().clone() for t in flatten_tensors(mod(*args))]
            mod.train()
            tr = [t.detach().clone() for t in flatten_tensors(mod(*args))]
    finally:
        mod.eval()
        with torch.no_grad():
            for k, v in mod.named_buffers():
                v.copy_(saved[k])
    return float(max((torch.max(torch.abs(a.double() - b.double())).item() for a, b in zip(ev, tr)), default=0.0))


def _inputs_source(triage, prep: TorchPrepared) -> str:
    if prep.input_file is not None:
        return "the factory's example inputs, torch/example_inputs.npz and input.npz"
    if triage.opts.input_file:
        return f"from {Path(triage.opts.input_file).name}, copied to input.npz"
    return f"generated with seed {triage.opts.seed}, input.npz"


def golden_key(prep: TorchPrepared, baseline_manifest: dict) -> str:
    return stable_key("torch-golden/v1", prep.loaded.state_sha256, baseline_manifest["key"], torch.__version__)


def run_golden(triage, prep: TorchPrepared) -> dict:
    """Hooks twice, cross-check against the ONNX baseline, pitfalls; cached by key."""
    from bisect_tui.core.cancel import Progress
    from bisect_tui.frontends.torch.crosscheck import crosscheck

    session = triage.session
    key = golden_key(prep, triage.baseline.manifest)
    cached = session.read_json(f"{TORCH_DIR}/crosscheck.json")
    gdir = prep.dir / "golden"
    if cached and cached.get("key") == key and (gdir / "manifest.json").exists():
        return cached
    t0 = time.perf_counter()
    loaded = prep.loaded
    samples = [factory.feeds_to_args(loaded, triage.inputs.feeds(k)) for k in range(triage.inputs.samples)]
    gdir.mkdir(parents=True, exist_ok=True)
    (gdir / "manifest.json").unlink(missing_ok=True)
    triage.progress(Progress("torch", "PyTorch forward with hooks on every module (run 1 of 2)"))
    before = factory.state_digest(loaded.module)
    run1 = run_recorded(loaded.module, samples, gdir)
    entries, errors = run1.entries, run1.problems
    after1 = factory.state_digest(loaded.module)
    triage.cancel.check()
    triage.progress(Progress("torch", "PyTorch forward again for determinism (run 2 of 2)"))
    run2 = run_recorded(loaded.module, samples, None)
    entries2, errors2 = run2.entries, run2.problems
    after2 = factory.state_digest(loaded.module)
    second = {e["name"]: e["sha256"] for e in entries2}
    differing = [e for e in entries if second.get(e["name"]) != e["sha256"]]
    manifest = {
        "key": key, "created": now_iso(), "spec": prep.spec.text, "torch": torch.__version__,
        "samples": len(samples), "precision": "fp32", "mode": "eval",
        "entries": entries, "problems": errors + errors2,
        "bytes": sum(e["bytes"] for e in entries),
        "deterministic": not differing and len(entries) == len(entries2),
        "differing": [e["name"] for e in differing],
        "state_sha256": {"before": before, "after_run1": after1, "after_run2": after2},
        "rss_bytes": {"start": run1.rss_start, "peak": run1.rss_peak},
        "seconds": time.perf_counter() - t0,
    }
    write_manifest(gdir, manifest)  # last: marks the dump complete
    triage.progress(Progress("torch", "cross-checking module outputs against the ONNX baseline"))
    by_name = {e["name"]: e for e in entries}
    known = {p for p, _ in loaded.module.named_modules()}
    check, arrays = crosscheck(entries, lambda e: load_golden(gdir, by_name[e["name"]]), session,
                               triage.baseline.manifest, triage.info.index, known)
    rec = prep.record
    train_moves = _train_vs_eval(loaded, samples[0])
    not_fp32 = [e["name"] for e in entries if e["model_dtype"] not in ("float32",) and
                e["model_dtype"].startswith(("float", "bfloat"))]
    soft, batch = pitfalls.output_shape_pitfalls(check.failing, arrays)
    found = [
        pitfalls.training_mode(rec["training_at_load"], rec["still_training"], train_moves),
        pitfalls.weights_changed(before, after1, after2, rec.get("second_call") or {}),
        pitfalls.inputs_fixed(_inputs_source(triage, prep), rec.get("second_call") or {}),
        pitfalls.nondeterminism(differing, len(entries)),
        pitfalls.dtype_alignment(rec.get("dtype_changes") or [], not_fp32),
        soft,
        batch,
        pitfalls.baked_values(rec.get("tracer_warnings") or [], rec["exporter"]),
    ]
    cc = check.to_dict()
    result = {
        "key": key,
        "spec": prep.spec.text,
        "export": {k: rec.get(k) for k in ("exporter", "exporter_requested", "fallback_reason", "opset",
                                           "torch_version", "traced_with", "onnx_sha256", "seconds")},
        "golden": {"dir": str(gdir), "tensors": len(entries), "bytes": manifest["bytes"],
                   "rss_growth_bytes": (run1.rss_peak - run1.rss_start) if run1.rss_start else None,
                   "deterministic": manifest["deterministic"], "differing": manifest["differing"][:20],
                   "problems": manifest["problems"]},
        "crosscheck": cc,
        "export_matches": cc["passed"] and not differing,
        "pitfalls": [p.to_dict() for p in found],
        "seconds": time.perf_counter() - t0,
    }
    atomic.write_json(prep.dir / "crosscheck.json", result)
    return result


def float64_truth(triage, prep: TorchPrepared) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], str]:
    """PyTorch in float64 on the session's inputs: (truth, framework FP32 outputs,
    source). The module is widened in place and narrowed back; its digest is
    checked so the FP32 weights are provably the same afterwards."""
    mod = prep.loaded.module
    names = list(triage.info.outputs)
    before = factory.state_digest(mod)
    buffers = {k: v.detach().clone() for k, v in mod.named_buffers()}  # a forward may write them
    truth: dict[str, list] = {n: [] for n in names}
    fp32: dict[str, list] = {n: [] for n in names}
    try:
        with torch.no_grad():
            for k in range(triage.inputs.samples):
                args = factory.feeds_to_args(prep.loaded, triage.inputs.feeds(k))
                outs = [t.detach().float().numpy() for t in flatten_tensors(mod(*args))]
                for n, o in zip(names, outs):
                    fp32[n].append(o)
            mod.double()
            for k in range(triage.inputs.samples):
                args = tuple(a.double() if a.is_floating_point() else a
                             for a in factory.feeds_to_args(prep.loaded, triage.inputs.feeds(k)))
                outs = [t.detach().double().numpy() for t in flatten_tensors(mod(*args))]
                if len(outs) != len(names):
                    raise UserError(f"PyTorch returns {len(outs)} output(s), the export {len(names)}: "
                                    "cannot pair them for the float64 arbiter")
                for n, o in zip(names, outs):
                    truth[n].append(o)
    finally:
        mod.float()
        with torch.no_grad():
            for k, v in mod.named_buffers():
                v.copy_(buffers[k])
    if factory.state_digest(mod) != before:
        raise RuntimeError("weights differ after the float64 run")  # a bug: never a verdict
    return ({n: np.stack(v) for n, v in truth.items()}, {n: np.stack(v) for n, v in fp32.items()},
            f"PyTorch {torch.__version__} in float64 (module.double())")
