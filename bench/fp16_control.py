"""The FP16 keep-set's control on every corpus model: with every node kept in
FP32, does ORT's FP16 model (bisect_tui.engines.ort.fp16.convert) give the FP32
result? And onnxruntime's converter with every node in node_block_list (the
instrument before issue 21)? Each against plain ORT FP32, both at
ORT_DISABLE_ALL (bit-for-bit expected) and at ORT_ENABLE_ALL (against FP32 at
ORT_ENABLE_ALL), on one random input per model (the shapes of real_models.py).

    python bench/fp16_control.py [--only NAME]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bisect_tui.engines.ort import fp16  # noqa: E402
from real_models import CACHE, MODELS  # noqa: E402


def feeds_for(model: onnx.ModelProto, args: list[str]) -> dict:
    shapes, values = {}, {}
    for flag, val in zip(args[::2], args[1::2]):
        name, _, v = val.partition("=")
        if flag == "--shape":
            shapes[name] = [int(x) for x in v.split("x")]
        elif flag == "--input-value":
            values[name] = v
    rng = np.random.default_rng(0)
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if i.name in values:
            out[i.name] = np.array(values[i.name]).astype(dt)
            continue
        shp = shapes.get(i.name) or [d.dim_value or 1 for d in tt.shape.dim]
        out[i.name] = rng.standard_normal(shp).astype(dt) if dt.kind == "f" else np.zeros(shp, dt)
    return out


def run(model: onnx.ModelProto, feeds: dict, level) -> list:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def max_abs(a: list, b: list) -> float:
    errs = [float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) if x.size else 0.0
            for x, y in zip(a, b) if np.asarray(x).dtype.kind == "f"]
    return max(errs, default=0.0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    a = ap.parse_args()
    from onnxruntime.transformers.float16 import convert_float_to_float16

    off, on = ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    print("| model | nodes | FP16 (nothing kept) | keep all: ours, DISABLE_ALL | ours, ENABLE_ALL vs FP32 ENABLE_ALL "
          "| ORT converter, all blocked | casts to FP16 left (ours / ORT's) |")
    print("|---|---|---|---|---|---|---|")
    for m in MODELS:
        if a.only and a.only not in m.name:
            continue
        path = CACHE / "models" / Path(m.member).name
        if not path.exists():
            print(f"| {m.name} | not fetched | | | | | |")
            continue
        t0 = time.time()
        model = onnx.load(str(path))
        fp16.name_nodes(model)
        feeds = feeds_for(model, m.args)
        every = [n.name for n in model.graph.node]
        cells = []
        try:
            ref, ref_on = run(model, feeds, off), run(model, feeds, on)
            none, _ = fp16.convert(model)
            kept, _ = fp16.convert(model, every)
            old = convert_float_to_float16(model, keep_io_types=True, node_block_list=every)
            for conv, level, base in ((none, off, ref), (kept, off, ref), (kept, on, ref_on), (old, off, ref)):
                try:
                    cells.append(f"{max_abs(run(conv, feeds, level), base):.3g}")
                except Exception as e:  # noqa: BLE001 - a model the converter breaks: its message is the figure
                    cells.append("error: " + str(e).splitlines()[0][:80])
            casts = lambda x: sum(1 for n in x.graph.node if n.op_type == "Cast" and  # noqa: E731
                                  any(t.name == "to" and t.i == 10 for t in n.attribute))
            cells.append(f"{casts(kept)} / {casts(old)}")
        except Exception as e:  # noqa: BLE001
            cells = ["error: " + str(e).splitlines()[0][:100]] + [""] * 4
        print(f"| {m.name} | {len(every)} | " + " | ".join(cells) + f" |  <!-- {time.time() - t0:.1f}s -->",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
