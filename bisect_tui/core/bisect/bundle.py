"""The minimal repro bundle: a zip a bug tracker accepts and anyone can run.

It holds the culprit's extracted subgraph, the baseline's own tensors as its
inputs, the unfused FP32 outputs as the expectation (plus the float64 truth
when available), and `repro.py`, which needs only numpy and onnxruntime,
prints the error and exits 1 while the bug is present and 0 once it is fixed
(or with `--disable NAME` for the workaround).
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

from bisect_tui.core import atomic
from bisect_tui.core.bisect.repro_judge import with_judge

# The script is a constant: nothing from the model (node names, optimizer
# names, config values) is ever pasted into its source. Everything it needs
# comes from repro.json next to it, read as data at run time, so a crafted
# name like `"""; import os; os.system(...)` stays a string.
REPRO_SCRIPT = '''#!/usr/bin/env python3
"""Repro of a fused-operator accuracy bug found by bisect-tui.

Needs only numpy and onnxruntime. Runs subgraph.onnx (the culprit's original
nodes, listed in repro.json) with ONNX Runtime's optimizations as configured
in repro.json, on the exact tensors the FP32 baseline fed them (inputs.npz),
and compares with the unfused FP32 result (expected.npz).

    python repro.py                 # exit 1 while the bug is present, 0 when fixed
    python repro.py --disable NAME  # try with an optimizer disabled (the workaround)
"""
import argparse
import json
import os
import sys

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "repro.json"), encoding="utf-8") as _fh:
    SPEC = json.load(_fh)
CONFIG = SPEC["config"]
TOLERANCE = SPEC["tolerance"]
LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def shown(text):
    """Names from the model, printed without their control characters."""
    return "".join(c if c.isprintable() else "\\\\x%02x" % ord(c) if ord(c) < 256 else "\\\\u%04x" % ord(c)
                   for c in str(text))


def session(disabled):
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[CONFIG["level"]])
    for key, value in CONFIG["config_entries"].items():
        so.add_session_config_entry(key, value)
    model = os.path.join(HERE, "subgraph.onnx")
    if CONFIG["precision"] == "fp16":
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(onnx.load(model), keep_io_types=True).SerializeToString()
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled))


#@judge

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--disable", action="append", default=[], metavar="OPTIMIZER",
                    help="disable an ONNX Runtime optimizer (repeatable)")
    args = ap.parse_args()
    print("repro: %s" % shown(SPEC["title"]))
    disabled = list(CONFIG["disabled_optimizers"]) + args.disable
    inputs = np.load(os.path.join(HERE, "inputs.npz"), allow_pickle=False)
    expected = np.load(os.path.join(HERE, "expected.npz"), allow_pickle=False)
    try:
        sess = session(disabled)
    except Exception as exc:  # the fused engine does not even build: the bug is present
        print("the fused engine failed to build: %s" % str(exc).splitlines()[0])
        return 1
    names = list(SPEC["outputs"]) or list(expected.files)
    broken = False
    samples = next(iter(inputs.values())).shape[0]
    print("onnxruntime %s, level %s, precision %s, config %s, disabled %s"
          % (ort.__version__, shown(CONFIG["level"]), shown(CONFIG["precision"]),
             shown(CONFIG["config_entries"]), shown(disabled)))
    for k in range(samples):
        feeds = {n: np.asarray(inputs[n][k], order="C") for n in SPEC["inputs"]}
        outs = dict(zip(names, sess.run(names, feeds)))
        for n in names:
            max_abs, fails = judge(expected[n][k], outs[n], TOLERANCE)
            status = "FAIL" if fails else "ok"
            print("sample %d, output %s: max abs error vs unfused FP32 %.3g -> %s %s"
                  % (k, shown(n), max_abs, status, "; ".join(fails)))
            broken |= bool(fails)
    print("bug present: the fused result breaks tolerance" if broken else "within tolerance")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
'''
REPRO_SCRIPT = with_judge(REPRO_SCRIPT)


def write_ort_repro(dest: Path, spec) -> list[Path]:
    """ONNX Runtime's repro for one isolated culprit (the ORT engine's
    `write_repro`): the constant REPRO_SCRIPT plus repro.json holding every name."""
    extra = spec.extra
    title = (f"{extra.get('op_type')} fused by {', '.join(extra.get('optimizers') or []) or 'ONNX Runtime'} "
             f"breaks tolerance ({extra.get('fused_node')})")
    config = spec.config
    data = {
        "title": title,
        "generated_by": f"bisect-tui {extra.get('version', '')}",
        "fused_node": extra.get("fused_node"),
        "original_nodes": list(extra.get("original_nodes") or []),
        "inputs": list(extra.get("inputs") or []),
        "outputs": list(spec.outputs),
        "config": {
            "level": config["level"], "precision": config["precision"],
            "config_entries": dict(config.get("config_entries") or {}),
            "disabled_optimizers": list(config.get("disabled_optimizers") or []),
        },
        "tolerance": spec.tolerance,
    }
    dest = Path(dest)
    atomic.write_text(dest / "repro.json", json.dumps(data, indent=2))
    atomic.write_text(dest / "repro.py", REPRO_SCRIPT)
    return [dest / "repro.json", dest / "repro.py"]


def write_bundle(dest: Path, culprits: list[dict], config: dict, tolerance: dict, report_md: str,
                 version: str, engine=None, workaround: dict | None = None) -> Path:
    """Zip each isolated culprit (see isolate.py for the files) with the
    engine's repro script: the first in `repro/`, further ones in `repro_2/`..."""
    import tempfile

    from bisect_tui.api import ReproSpec

    buf = io.BytesIO()
    tol = {k: v for k, v in tolerance.items() if k in
           ("atol", "rtol", "max_abs", "mean_abs", "min_cosine", "max_fail_share")}
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z, \
            tempfile.TemporaryDirectory(prefix="bisect_tui_repro_") as tmp:
        for i, culprit in enumerate(culprits, 1):
            folder = "repro" if i == 1 else f"repro_{i}"
            iso = culprit["isolated"]
            sub_dir = Path(iso["subgraph"]).parent
            spec = ReproSpec(
                model_file="subgraph.onnx", inputs_file="inputs.npz", config=config,
                outputs=list(iso.get("subgraph_outputs") or []), tolerance=tol,
                reference={"file": "expected.npz", "name": "unfused FP32 (ORT_DISABLE_ALL)"},
                workaround=workaround,
                extra={"version": version, "op_type": culprit["op_type"], "fused_node": culprit["fused_node"],
                       "optimizers": culprit["optimizers"], "original_nodes": culprit["original_nodes"],
                       "inputs": list(iso.get("subgraph_inputs") or [])},
            )
            out = Path(tmp) / folder
            out.mkdir()
            written = (engine.write_repro(out, spec) if engine is not None else write_ort_repro(out, spec))
            for name in ("subgraph.onnx", "inputs.npz", "expected.npz", "truth_float64.npz"):
                p = sub_dir / name
                if p.exists():
                    z.write(p, f"{folder}/{name}")
            for p in written:
                z.write(p, f"{folder}/{p.name}")
        z.writestr("REPORT.md", report_md)
    atomic.write_bytes(Path(dest), buf.getvalue())
    return Path(dest)
