"""OpenVINO's repro script: constant text, every model-derived name and value
read from repro.json (names are data, never code)."""

from __future__ import annotations

from pathlib import Path

from bisect_tui.api import ReproSpec
from bisect_tui.core import atomic
from bisect_tui.core.bisect.repro_judge import with_judge
from bisect_tui.engines.openvino.declare import _HINTS

OV_REPRO_SCRIPT = r'''#!/usr/bin/env python3
"""Repro: an OpenVINO fusion breaks tolerance (settings and names in repro.json).

Needs only numpy and openvino. Compiles the model with the settings in
repro.json, runs it on the exact tensors the FP32 baseline fed it and compares
with the unfused FP32 result.

    python repro.py                # exit 1 while the bug is present, 0 when fixed
    python repro.py --workaround   # with the proven marking (exit 0 when it works)
    python repro.py --mark TENSOR  # try marking another tensor
"""
import argparse
import json
import os
import sys

import numpy as np
import openvino as ov

HERE = os.path.dirname(os.path.abspath(__file__))


#@judge

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workaround", action="store_true", help="apply the proven marking from repro.json")
    ap.add_argument("--mark", action="append", default=[], metavar="TENSOR", help="add a tensor as an output")
    args = ap.parse_args()
    with open(os.path.join(HERE, "repro.json"), encoding="utf-8") as fh:
        spec = json.load(fh)
    marks = list(args.mark) + (list(spec["workaround_marks"]) if args.workaround else [])
    core = ov.Core()
    try:
        model = core.read_model(os.path.join(HERE, spec["model"]))
    except Exception as exc:  # the front end cannot convert it: the bug is present (its whole message)
        print("OpenVINO could not read the model:\n%s" % str(exc).strip())
        return 1
    if marks:
        model.add_outputs(marks)
    props = dict(spec["properties"])
    props["INFERENCE_PRECISION_HINT"] = spec["precision_hint"]
    try:
        compiled = core.compile_model(model, spec["device"], props)
    except Exception as exc:  # the engine does not even build: the bug is present
        print("OpenVINO failed to compile the model:\n%s" % str(exc).strip())
        return 1
    used = compiled.get_property("INFERENCE_PRECISION_HINT")
    print("openvino %s, device %s, inference precision %s, marked %s"
          % (ov.__version__, spec["device"], used, marks or "none"))
    inputs = np.load(os.path.join(HERE, spec["inputs"]), allow_pickle=False)
    expected = np.load(os.path.join(HERE, spec["expected"]), allow_pickle=False)
    ports = {}
    for i, port in enumerate(compiled.outputs):
        for name in port.get_names():
            ports.setdefault(name, i)
    request = compiled.create_infer_request()
    broken = False
    samples = next(iter(inputs.values())).shape[0]
    for k in range(samples):
        values = list(request.infer({n: inputs[n][k] for n in inputs.files}).values())
        for name in spec["outputs"]:
            max_abs, fails = judge(expected[name][k], np.array(values[ports[name]]), spec["tolerance"])
            print("sample %d, output %r: max abs error vs %s %.3g -> %s %s"
                  % (k, name, spec["reference"], max_abs, "FAIL" if fails else "ok", "; ".join(fails)))
            broken |= bool(fails)
    print("bug present: the fused result breaks tolerance" if broken else "within tolerance")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
'''
OV_REPRO_SCRIPT = with_judge(OV_REPRO_SCRIPT)


def write_repro(dest: Path, spec: ReproSpec) -> list[Path]:
    """repro.py (constant text, below) + repro.json (every name and setting, as data)."""
    dest = Path(dest)
    data = {
        "engine": "openvino",
        "model": spec.model_file,
        "inputs": spec.inputs_file,
        "expected": spec.reference.get("file"),
        "reference": spec.reference.get("name"),
        "outputs": list(spec.outputs),
        "device": spec.config.get("options", {}).get("device", "CPU"),
        "precision_hint": _HINTS.get(spec.config.get("precision", "fp32"), "f32"),
        "properties": dict(spec.config.get("config_entries") or {}),
        "tolerance": spec.tolerance,
        "workaround_marks": list((spec.workaround or {}).get("marked_tensors") or []),
    }
    atomic.write_json(dest / "repro.json", data)
    atomic.write_text(dest / "repro.py", OV_REPRO_SCRIPT)
    return [dest / "repro.py", dest / "repro.json"]
