"""The TensorRT repro bundle: a constant script plus the JSON it reads.

The script text never changes with the model: every name (inputs, outputs,
layers to pin) is read from `repro_tensorrt.json`, so nothing from a model
ends up in code. It needs numpy, polygraphy and tensorrt on a GPU machine;
without them it says so and exits 5 (environment)."""

from __future__ import annotations

import json
from pathlib import Path

from bisect_tui.core import atomic

SCRIPT_NAME = "repro_tensorrt.py"
SPEC_NAME = "repro_tensorrt.json"

SCRIPT = r'''#!/usr/bin/env python3
"""Reproduce a TensorRT accuracy finding made by bisect-tui.

    python repro_tensorrt.py                    # the engine as the user built it
    python repro_tensorrt.py --with-workaround  # with the proven FP32 keep-set

Builds the engine with Polygraphy, runs the saved inputs, compares every output
with the saved reference under the recorded tolerance. Everything it uses is
read from repro_tensorrt.json next to this file. Exit 0 within tolerance,
1 tolerance broken, 5 TensorRT/Polygraphy missing."""
import json
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
        from polygraphy.backend.trt import (CreateConfig, EngineFromNetwork, NetworkFromOnnxPath,
                                            PostprocessNetwork, TrtRunner)
    except ImportError as exc:
        print(f"needs tensorrt and polygraphy on a machine with an NVIDIA GPU: {exc}", file=sys.stderr)
        return 5
    workaround = spec.get("workaround") or {}
    use_fix = "--with-workaround" in argv
    keep = list(workaround.get("keep_fp32") or []) if use_fix else []
    pins = dict(workaround.get("layer_precisions") or {}) if use_fix else {}
    model = _inside(spec["model_file"])
    kwargs = dict(spec["create_config"])
    typed = not hasattr(trt.BuilderFlag, "FP16")  # TensorRT 11: strongly typed only
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
    network = NetworkFromOnnxPath(str(model))
    if pins and not typed:
        def pin(network):
            for layer in network:
                if layer.name in pins:
                    layer.precision = trt.float32
                    for i in range(layer.num_outputs):
                        layer.set_output_type(i, trt.float32)
        network = PostprocessNetwork(network, pin, name="KeepFp32")
    engine = EngineFromNetwork(network, config=CreateConfig(**kwargs))
    inputs = np.load(_inside(spec["inputs_file"]), allow_pickle=False)
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


def write_repro(dest: Path, spec, create_config: dict, input_names: list, precision: str) -> list:
    """Write the script and its JSON into `dest`; `spec` is a ReproSpec."""
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
        "workaround": dict(spec.workaround or {}),
        "config": dict(spec.config),
    }
    script, meta = dest / SCRIPT_NAME, dest / SPEC_NAME
    atomic.write_text(script, SCRIPT)
    atomic.write_text(meta, json.dumps(data, indent=1, sort_keys=True))
    script.chmod(0o755)
    return [script, meta]
