"""ONNX Runtime's repro scripts: the isolated culprit's (`repro/` in the bundle,
the engine's `write_repro`) and the FP16 keep-set's (`keepset/`).

Each script is a constant: nothing from the model (node names, pass names,
config values) is ever pasted into its source. Everything it needs comes from
the JSON next to it, read as data at run time, so a crafted name that
closes a string and calls os.system stays a string. The level table is ours
(levels.py), written in once when this module loads.
"""

from __future__ import annotations

import json
from pathlib import Path

from bisect_tui.core import atomic
from bisect_tui.core.bisect.repro_judge import with_judge
from bisect_tui.engines.ort.levels import LEVEL_NAMES

# --------------------------------------------------------------------------- the culprit's repro

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
LEVELS = @LEVELS@


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
        try:
            outs = dict(zip(names, sess.run(names, feeds)))
        except Exception as exc:  # built, then fails while running: the bug is present
            print("the fused engine failed while running: %s" % str(exc).splitlines()[0])
            return 1
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
def _levels_literal() -> str:
    """LEVEL_NAMES as the Python dict literal the scripts hold."""
    return "{\n" + "".join(f"    {json.dumps(k)}: {json.dumps(v)},\n" for k, v in LEVEL_NAMES.items()) + "}"


REPRO_SCRIPT = with_judge(REPRO_SCRIPT.replace("@LEVELS@", _levels_literal()))


def write_ort_repro(dest: Path, spec) -> list[Path]:
    """The repro of one isolated culprit: the constant REPRO_SCRIPT plus
    repro.json holding every name."""
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


# --------------------------------------------------------------------------- the keep-set's repro

KEEPSET_SCRIPT = '''#!/usr/bin/env python3
"""Repro of an FP16 engine failure and its keep-set (generated by bisect-tui).

Needs numpy, onnx and onnxruntime. Settings and node names are in keepset.json.
The FP16 model is made by fp16_convert.py next to this script: onnxruntime's
convert_float_to_float16(keep_io_types=True, node_block_list=...) with its FP16
round trips on kept nodes removed, so a kept node really computes in FP32.

    python repro_keepset.py          # FP16 as configured: exit 1 while it fails (build error or tolerance)
    python repro_keepset.py --keep   # with the keep-set in FP32: exit 0 when it passes
"""
import argparse
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fp16_convert import convert  # noqa: E402
LEVELS = @LEVELS@


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", action="store_true", help="keep the keep-set nodes in FP32")
    args = ap.parse_args()
    with open(os.path.join(HERE, "keepset.json"), encoding="utf-8") as fh:
        spec = json.load(fh)
    cfg = spec["config"]
    keep = list(spec["keep_fp32"]) if args.keep else list(cfg.get("keep_fp32") or [])
    model, _ = convert(onnx.load(os.path.join(HERE, "model.onnx")), keep)
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[cfg["level"]])
    so.log_severity_level = 3
    for key, value in (cfg.get("config_entries") or {}).items():
        so.add_session_config_entry(str(key), str(value))
    print("onnxruntime %s, level %s, fp16, keep in FP32: %s" % (ort.__version__, cfg["level"], keep or "none"))
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(cfg.get("disabled_optimizers") or []))
    except Exception as exc:
        print("build_error: %s" % str(exc).splitlines()[0])
        return 1
    inputs = np.load(os.path.join(HERE, "inputs.npz"), allow_pickle=False)
    expected = np.load(os.path.join(HERE, "expected.npz"), allow_pickle=False)
    tol = spec["tolerance"]
    samples = next(iter(inputs.values())).shape[0]
    broken = False
    for k in range(samples):
        try:
            outs = sess.run(list(expected.files), {n: inputs[n][k] for n in inputs.files})
        except Exception as exc:
            print("run_error: %s" % str(exc).splitlines()[0])
            return 1
        for name, got in zip(expected.files, outs):
            ref = expected[name][k].astype(np.float64)
            err = np.abs(got.astype(np.float64) - ref)
            bad = (~np.isfinite(err)) | (err > tol.get("atol", 0.0) + tol.get("rtol", 0.0) * np.abs(ref))
            fails = bool(bad.any())
            print("sample %d, output %s: max abs error vs FP32 baseline %.3g -> %s"
                  % (k, name, float(np.nanmax(err)) if err.size else 0.0, "FAIL" if fails else "ok"))
            broken |= fails
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
'''


KEEPSET_SCRIPT = KEEPSET_SCRIPT.replace("@LEVELS@", _levels_literal())


def add_keepset_repro(zip_path: Path, triage, result: dict, version: str) -> None:
    """Append `keepset/` to the bundle zip: the engine-neutral files, then this script."""
    from bisect_tui.core.bisect.keepset_bundle import append_keepset

    from bisect_tui.engines.ort import fp16

    append_keepset(zip_path, triage, result, version, "repro_keepset.py", KEEPSET_SCRIPT,
                   {"fp16_convert.py": Path(fp16.__file__).read_text(encoding="utf-8")})


__all__ = ["KEEPSET_SCRIPT", "REPRO_SCRIPT", "add_keepset_repro", "write_ort_repro"]
