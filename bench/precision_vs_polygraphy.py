"""Benchmark: bisect-tui's keep-set search against Polygraphy's `debug precision`
search, on the same FP16 ONNX Runtime engine, in one run.

    .venv/bin/python bench/precision_vs_polygraphy.py [--model sample_models/fp16_keepset.onnx]

`polygraphy debug precision` itself only drives TensorRT (it sets per-layer
precisions on a TensorRT network); this machine has no TensorRT. So the peer
side runs Polygraphy's *own* search code, unmodified: its `BisectMarker` and
`LinearMarker` classes (polygraphy.tools.debug.subtool.precision), in both
directions, asking "are the first/last N layers in FP32 enough?". Each answer
comes from a real engine build: the model converted with
`convert_float_to_float16(node_block_list=<those N original nodes>)`, built at
ORT_ENABLE_ALL and judged against the FP32 baseline with the fp16 preset
(atol = rtol = 1e-2, cosine >= 0.999), exactly as bisect-tui judges its own
keep-set tests. "Layers" are the original ONNX nodes in graph order (TensorRT
would count its own layers).

bisect-tui side: `bisect-tui bisect MODEL --precision fp16` as a subprocess;
builds = `bisect.precision.builds` (keep-set tests only), answer = the named
keep-set. Prints builds, answer size and whether each answer was rechecked to
pass; no asserts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]


def _engine_passes(model: onnx.ModelProto, keep: list[str], feeds: dict, ref: list) -> bool:
    import onnxruntime as ort
    from onnxruntime.transformers.float16 import convert_float_to_float16

    m = convert_float_to_float16(model, keep_io_types=True, node_block_list=list(keep) or None)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        out = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception:  # noqa: BLE001 - a build failure is a failing configuration for both searches
        return False
    for o, r in zip(out, ref):
        o = o.astype(np.float64)
        r = r.astype(np.float64)
        if not np.all(np.abs(o - r) <= 1e-2 + 1e-2 * np.abs(r)):
            return False
        cos = float(np.dot(o.ravel(), r.ravel()) / (np.linalg.norm(o) * np.linalg.norm(r) + 1e-30))
        if cos < 0.999:
            return False
    return True


def polygraphy_search(model: onnx.ModelProto, feeds: dict, ref: list, mode: str, direction: str) -> dict:
    from polygraphy.tools.debug.subtool.precision import BisectMarker, LinearMarker

    names = [n.name for n in model.graph.node]
    marker = (BisectMarker if mode == "bisect" else LinearMarker)(len(names), direction)
    builds = 0
    t0 = time.perf_counter()
    while True:
        keep = [names[i] for i in marker.select_layers()]
        ok = _engine_passes(model, keep, feeds, ref)
        builds += 1
        if marker.step(ok):
            break
    n = marker.good
    answer = names[:n] if direction == "forward" else names[len(names) - n:]
    found = n <= len(names)
    return {"tool": f"polygraphy {mode}/{direction}", "builds": builds, "answer_size": n if found else None,
            "answer": f"{'first' if direction == 'forward' else 'last'} {n} layer(s)" if found else "none",
            "passes": _engine_passes(model, answer, feeds, ref) if found else False,
            "seconds": time.perf_counter() - t0}


def bisect_tui_search(model_path: Path, tmp: Path) -> dict:
    js = tmp / "out.json"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bisect_tui.cli", "bisect", str(model_path), "--precision", "fp16",
                    "--session", str(tmp / "s"), "--json", str(js), "-q"], capture_output=True, timeout=600)
    wall = time.perf_counter() - t0
    p = json.loads(js.read_text())["bisect"]["precision"]
    return {"tool": "bisect-tui keep-set", "builds": p["builds"], "answer_size": len(p["keep_fp32"]),
            "answer": ", ".join(p["keep_fp32"]), "passes": p["passed"], "seconds": wall,
            "note": "seconds include the whole checklist and graph search"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "sample_models" / "fp16_keepset.onnx")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    model = onnx.load(str(args.model))
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    # the same input bisect-tui generates for a seed-0 session (standard normal, float32)
    feeds = {n: np.random.default_rng(0).standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    rows = [polygraphy_search(model, feeds, ref, mode, d) for mode in ("bisect", "linear")
            for d in ("forward", "reverse")]
    with tempfile.TemporaryDirectory() as d:
        rows.append(bisect_tui_search(args.model, Path(d)))
    print(f"model: {args.model.name} ({len(model.graph.node)} nodes), FP16 on onnxruntime {ort.__version__}")
    print(f"{'search':<28} {'builds':>6} {'answer size':>12} {'passes':>7}  answer")
    for r in rows:
        print(f"{r['tool']:<28} {r['builds']:>6} {str(r['answer_size']):>12} {str(r['passes']):>7}  {r['answer']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
