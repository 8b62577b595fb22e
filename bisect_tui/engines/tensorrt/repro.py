"""The TensorRT repro bundle: two constant scripts plus the JSON they read.

The script texts never change with the model: every name (inputs, outputs,
layers to pin) is read from `repro_tensorrt.json`, so nothing from a model
ends up in code. `repro_tensorrt.py` builds the engine as the search did:
one optimization profile with exactly the saved inputs' shapes (widened by
the user's `--trt-profile` ranges), the INT8 calibration cache copied into
the bundle, TensorRT 11 told apart by its major version as well as by the
missing FP16 flag. `keep_fp32.py` is the FP32 pin of the proof (precision
and FP32 output types) as a Polygraphy network postprocess script
(`polygraphy convert ... --trt-npps keep_fp32.py`); the repro uses it too.
They need numpy, polygraphy and tensorrt on a GPU machine; without them the
repro says so and exits 5 (environment)."""

from __future__ import annotations

import json
from pathlib import Path

from bisect_tui.core import atomic

SCRIPT_NAME = "repro_tensorrt.py"
SPEC_NAME = "repro_tensorrt.json"
KEEP_NAME = "keep_fp32.py"

KEEP_SCRIPT = r'''"""FP32 pins of a bisect-tui keep-set proof, as a Polygraphy network script.

    polygraphy convert model.onnx --fp16 --precision-constraints obey --trt-npps keep_fp32.py -o model.engine

Sets FP32 precision on the layers repro_tensorrt.json lists (and on every layer
whose metadata names a kept ONNX node), and FP32 output types on the outputs the
proof typed (on float outputs when the layer is found by metadata; never on
Cast/Quantize/Dequantize/Fill layers, whose output type is their own)."""
import json
from pathlib import Path

_OWN_TYPE = ("CAST", "QUANTIZE", "DEQUANTIZE", "DYNAMIC_QUANTIZE", "FILL")


def _from_kept_node(metadata, nodes):
    return any(("[ONNX Layer: " + n + "]") in metadata or ("[ONNX Layer: " + n + " | ") in metadata for n in nodes)


def postprocess(network):
    import tensorrt as trt

    spec = json.loads((Path(__file__).resolve().parent / "repro_tensorrt.json").read_text())
    fix = spec.get("workaround") or {}
    pins = set(fix.get("layer_precisions") or {})
    typed = {k: [int(i) for i in v] for k, v in (fix.get("output_types") or {}).items()}
    nodes = list(fix.get("keep_fp32") or [])
    floats = (trt.float32, trt.float16, getattr(trt, "bfloat16", trt.float16))
    for layer in network:
        by_meta = _from_kept_node(str(getattr(layer, "metadata", "") or ""), nodes)
        if layer.name not in pins and not by_meta:
            continue
        layer.precision = trt.float32
        if str(layer.type).split(".")[-1] in _OWN_TYPE:
            continue
        outs = typed.get(layer.name)
        if outs is None:
            outs = [i for i in range(layer.num_outputs) if layer.get_output(i).dtype in floats]
        for i in outs:
            layer.set_output_type(i, trt.float32)
    return network
'''

SCRIPT = r'''#!/usr/bin/env python3
"""Reproduce a TensorRT accuracy finding made by bisect-tui.

    python repro_tensorrt.py                    # the engine as the user built it
    python repro_tensorrt.py --with-workaround  # with the proven FP32 keep-set

Builds the engine with Polygraphy, runs the saved inputs, compares every output
with the saved reference under the recorded tolerance. Everything it uses is
read from repro_tensorrt.json next to this file. Exit 0 within tolerance,
1 tolerance broken, 5 TensorRT/Polygraphy missing."""
import json
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _inside(name):
    p = (HERE / name).resolve()
    if HERE not in p.parents and p != HERE:
        raise SystemExit(f"refusing a path outside the bundle: {name!r}")
    return p


def main(argv):
    spec = json.loads((HERE / "repro_tensorrt.json").read_text())
    try:
        import tensorrt as trt
        from polygraphy.backend.trt import (Calibrator, CreateConfig, EngineFromNetwork, NetworkFromOnnxPath,
                                            PostprocessNetwork, Profile, TrtRunner)
    except ImportError as exc:
        print(f"needs tensorrt and polygraphy on a machine with an NVIDIA GPU: {exc}", file=sys.stderr)
        return 5
    workaround = spec.get("workaround") or {}
    use_fix = "--with-workaround" in argv
    keep = list(workaround.get("keep_fp32") or []) if use_fix else []
    model = _inside(spec["model_file"])
    kwargs = dict(spec["create_config"])
    # TensorRT 11 is strongly typed only: its major version says so, and its missing FP16 flag
    typed = int(str(trt.__version__).split(".")[0]) >= 11 or not hasattr(trt.BuilderFlag, "FP16")
    if typed:
        for k in ("fp16", "bf16", "int8"):
            kwargs.pop(k, None)
        kwargs.pop("precision_constraints", None)
        if spec.get("precision") == "fp16":
            import onnx
            from onnxruntime.transformers.float16 import convert_float_to_float16

            conv = convert_float_to_float16(onnx.load(str(model)), keep_io_types=True,
                                            node_block_list=keep or None)
            model = HERE / "model_fp16_repro.onnx"
            onnx.save(conv, str(model))
    inputs = np.load(_inside(spec["inputs_file"]), allow_pickle=False)
    # the profile the search built with: exactly the saved inputs' shapes, or the user's ranges;
    # names are fnmatch patterns to Polygraphy, so * ? [ are written as one-character classes
    profile = Profile()
    ranges = spec.get("profile_ranges") or {}
    for name in spec["input_names"]:
        key = re.sub(r"([*?\[])", r"[\1]", name)
        if name in ranges:
            lo, opt, hi = ranges[name]
        else:
            lo = opt = hi = list(inputs[name].shape[1:])
        profile.add(key, min=list(lo), opt=list(opt), max=list(hi))
    kwargs["profiles"] = [profile]
    if spec.get("calibration_cache") and not typed and kwargs.get("int8"):
        kwargs["calibrator"] = Calibrator(data_loader=[], cache=str(_inside(spec["calibration_cache"])))
    network = NetworkFromOnnxPath(str(model))
    if use_fix and not typed:
        from keep_fp32 import postprocess

        network = PostprocessNetwork(network, postprocess, name="KeepFp32")
    engine = EngineFromNetwork(network, config=CreateConfig(**kwargs))
    ref = np.load(_inside(spec["reference"]["file"]), allow_pickle=False)
    tol = spec["tolerance"]
    failed = False
    # arrays hold (samples, *shape), as everything bisect-tui writes
    samples = next(iter(inputs.values())).shape[0]
    with TrtRunner(engine) as runner:
        for k in range(samples):
            out = runner.infer({name: np.ascontiguousarray(inputs[name][k]) for name in spec["input_names"]})
            for name in spec["outputs"]:
                t = tol.get(name, tol) if isinstance(tol.get(name), dict) else tol
                atol, rtol = float(t.get("atol") or 0.0), float(t.get("rtol") or 0.0)
                got = np.asarray(out[name], dtype=np.float64)
                want = np.asarray(ref[name][k], dtype=np.float64)
                err = np.abs(got - want)
                bad = ~(err <= atol + rtol * np.abs(want))
                worst = float(np.nanmax(err)) if err.size else 0.0
                ok = not bool(bad.any()) and bool(np.isfinite(got).all())
                failed |= not ok
                print(f"{'PASS' if ok else 'FAIL'} sample {k} {json.dumps(name)}: max abs error {worst:.3g} "
                      f"(atol {atol:g}, rtol {rtol:g}), {int(bad.sum())} of {bad.size} elements outside")
    print("tolerance broken" if failed else "within tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
'''


def write_repro(dest: Path, spec, create_config: dict, input_names: list, precision: str,
                workaround: dict | None = None, profile_ranges: dict | None = None,
                calibration_cache: str | None = None) -> list:
    """Write the scripts and their JSON into `dest`; `spec` is a ReproSpec,
    `workaround` its workaround with the pins the proof made."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    data = {
        "model_file": spec.model_file,
        "inputs_file": spec.inputs_file,
        "input_names": list(input_names),  # graph inputs of the bundled model
        "outputs": list(spec.outputs),
        "tolerance": dict(spec.tolerance),
        "reference": dict(spec.reference),
        "precision": precision,
        "create_config": dict(create_config),
        "workaround": dict(workaround if workaround is not None else (spec.workaround or {})),
        "config": dict(spec.config),
        "profile_ranges": dict(profile_ranges or {}),
        "calibration_cache": calibration_cache,
    }
    script, meta, keep = dest / SCRIPT_NAME, dest / SPEC_NAME, dest / KEEP_NAME
    atomic.write_text(script, SCRIPT)
    atomic.write_text(keep, KEEP_SCRIPT)
    atomic.write_text(meta, json.dumps(data, indent=1, sort_keys=True))
    script.chmod(0o755)
    out = [script, meta, keep]
    if calibration_cache:
        out.append(dest / calibration_cache)
    return out
