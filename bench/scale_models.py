"""Models of about 100, 1,000 and 5,000+ nodes with one known culprit, built in code.

Residual stacks, so depth does not amplify FP32 rounding (a plain 40-block
stack already does, see sample_models' amplifying_stack):

- transformer-like: pre-norm blocks x + W2 act(W1 LN(x)), the activation Relu
  everywhere except one erf-Gelu block (the culprit under the Gelu
  approximation: 5 original nodes become FastGelu);
- CNN: blocks x + Conv1x1(act(Conv3x3(x))), Relu except one erf-Gelu block.

Blocks, widths and scales are chosen so the engine at ORT_ENABLE_ALL passes
the fp32 preset and breaks it with optimization.enable_gelu_approximation=1;
`python bench/scale_models.py` prints each model's node count and that check.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sample_models"))

from build import Graph, gelu, layernorm, linear  # noqa: E402


def transformer_stack(n_blocks: int, culprit_block: int, seed: int = 13, seq: int = 8, d: int = 32):
    """Returns (model, expected culprit node names)."""
    g = Graph(f"tstack{n_blocks}", seed=seed)
    t = g.input("x", [1, seq, d])
    culprit: list[str] = []
    for i in range(n_blocks):
        p = f"blk{i}"
        h = layernorm(g, f"{p}/ln", t, d)
        h = linear(g, f"{p}/fc1", h, d, d, w_std=2.0 / math.sqrt(d))
        if i == culprit_block:
            h, culprit = gelu(g, f"{p}/gelu", h)
        else:
            h = g.op("Relu", f"{p}/relu", [h])
        h = linear(g, f"{p}/fc2", h, d, d, w_std=(1.0 if i == culprit_block else 0.3) / math.sqrt(d), b_std=0.01)
        t = g.op("Add", f"{p}/res", [t, h])
    g.output(t, [1, seq, d])
    return g.model(f"{n_blocks}-block pre-norm residual stack, erf-Gelu in block {culprit_block}"), culprit


def cnn_stack(n_blocks: int, culprit_block: int, seed: int = 17, c: int = 8, hw: int = 8):
    g = Graph(f"cstack{n_blocks}", seed=seed)
    t = g.input("image", [1, c, hw, hw])
    culprit: list[str] = []
    for i in range(n_blocks):
        p = f"blk{i}"
        w = g.weight(f"{p}/conv3/W", (c, c, 3, 3), 2.0 / math.sqrt(c * 9))
        b = g.weight(f"{p}/conv3/b", (c,), 0.1)
        h = g.op("Conv", f"{p}/conv3", [t, w, b], pads=[1, 1, 1, 1], kernel_shape=[3, 3])
        if i == culprit_block:
            h, culprit = gelu(g, f"{p}/gelu", h)
        else:
            h = g.op("Relu", f"{p}/relu", [h])
        w1 = g.weight(f"{p}/conv1/W", (c, c, 1, 1), (1.0 if i == culprit_block else 0.05) / math.sqrt(c))
        b1 = g.weight(f"{p}/conv1/b", (c,), 0.01)
        h = g.op("Conv", f"{p}/conv1", [h, w1, b1], kernel_shape=[1, 1])
        t = g.op("Add", f"{p}/res", [t, h])
    g.output(t, [1, c, hw, hw])
    return g.model(f"{n_blocks}-block residual conv stack, erf-Gelu in block {culprit_block}"), culprit


# name -> (builder, blocks, culprit block); node counts: transformer 15/block (+4 for the Gelu),
# CNN 4/block (+4)
MODELS = {
    "transformer_100": (transformer_stack, 7, 4),
    "transformer_1000": (transformer_stack, 66, 41),
    "transformer_5000": (transformer_stack, 340, 211),
    "cnn_100": (cnn_stack, 25, 17),
    "cnn_1000": (cnn_stack, 250, 157),
}


def build(name: str, out: Path):
    fn, blocks, culprit = MODELS[name]
    model, expected = fn(blocks, culprit)
    import onnx

    onnx.save(model, str(out))
    input_name = model.graph.input[0].name
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"model": str(out), "nodes": len(model.graph.node), "expected": [expected],
            "input": {input_name: shape}}


def _check(path: Path, info: dict) -> str:
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in info["input"].items()}

    def run(level, entries=()):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.log_severity_level = 3
        for k, v in entries:
            so.add_session_config_entry(k, v)
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]

    ref = run(ort.GraphOptimizationLevel.ORT_DISABLE_ALL).astype(np.float64)
    out = []
    for label, entries in (("all", ()), ("all+gelu-approx", (("optimization.enable_gelu_approximation", "1"),))):
        got = run(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, entries).astype(np.float64)
        ratio = float(np.max(np.abs(got - ref) / (1e-4 + 1e-4 * np.abs(ref))))
        out.append(f"{label}: x{ratio:.3g} of atol=rtol=1e-4")
    return "; ".join(out)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for name in (sys.argv[1:] or list(MODELS)):
            p = Path(d) / f"{name}.onnx"
            info = build(name, p)
            print(f"{name}: {info['nodes']} nodes; {_check(p, info)}")
