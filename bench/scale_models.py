"""Models of about 100, 1,000 and 5,000+ nodes with one known culprit, built in code.

Residual stacks, so depth does not amplify FP32 rounding (a plain 40-block
stack already does, see sample_models' amplifying_stack):

- transformer-like: pre-norm blocks x + W2 act(W1 LN(x)), the activation Relu
  everywhere except one erf-Gelu block (the culprit under the Gelu
  approximation: 5 original nodes become FastGelu);
- CNN: blocks x + Conv1x1(act(Conv3x3(x))), Relu except one erf-Gelu block;
- two culprits, one behind the other (ONNX Runtime issue 30513): the transformer-like
  stack on square [1, d, d] activations where one block's LayerNorm reduces with
  keepdims=0, which the graph computes as written (the mean of row j subtracted from
  column j) and LayerNormFusionL1 fuses into a true LayerNormalization anyway; with
  that pass disabled, SimplifiedLayerNormFusion fuses the same block's Pow..Mul just
  as wrongly. The engine breaks at its default config, no setting needed.

Blocks, widths and scales are chosen so the engine at ORT_ENABLE_ALL passes
the fp32 preset and breaks it with optimization.enable_gelu_approximation=1
(the two-culprit stacks break it at ORT_ENABLE_ALL itself);
`python bench/scale_models.py` prints each model's node count and that check.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sample_models"))

from build import LAYERNORM_PARTS, Graph, gelu, layernorm, linear  # noqa: E402


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


def layernorm_keepdims0(g: Graph, p: str, x: str, dim: int) -> tuple[str, list[str], list[str]]:
    """sample_models' decomposed LayerNorm with both ReduceMeans at keepdims=0 (issue 30513):
    on [1, d, d] it broadcasts along the wrong axis but stays a valid graph.
    Returns (output, the nodes LayerNormFusion takes, those SimplifiedLayerNormFusion
    takes once it is disabled)."""
    y = layernorm(g, p, x, dim, keepdims=0)
    full = [f"{p}/{k}" for k in LAYERNORM_PARTS]
    simplified = [f"{p}/{k}" for k in LAYERNORM_PARTS if k not in ("mean", "sub", "add_beta")]
    return y, full, simplified


def two_culprit_stack(n_blocks: int, culprit_block: int, seed: int = 19, d: int = 16):
    """transformer_stack on [1, d, d] with block `culprit_block`'s LayerNorm at keepdims=0.
    Returns (model, [the LayerNormalization's nodes, the SimplifiedLayerNormalization's])."""
    g = Graph(f"ln0stack{n_blocks}", seed=seed)
    t = g.input("x", [1, d, d])
    expected: list[list[str]] = []
    for i in range(n_blocks):
        p = f"blk{i}"
        if i == culprit_block:
            h, full, simplified = layernorm_keepdims0(g, f"{p}/ln", t, d)
            expected = [full, simplified]
        else:
            h = layernorm(g, f"{p}/ln", t, d)
        h = linear(g, f"{p}/fc1", h, d, d, w_std=2.0 / math.sqrt(d))
        h = g.op("Relu", f"{p}/relu", [h])
        h = linear(g, f"{p}/fc2", h, d, d, w_std=(1.0 if i == culprit_block else 0.3) / math.sqrt(d), b_std=0.01)
        t = g.op("Add", f"{p}/res", [t, h])
    g.output(t, [1, d, d])
    return g.model(f"{n_blocks}-block residual stack on [1, {d}, {d}], LayerNorm keepdims=0 in block "
                   f"{culprit_block}"), expected


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
    # two culprits, one behind the other: 15 nodes a block
    "ln0_500": (two_culprit_stack, 33, 21),
    "ln0_1000": (two_culprit_stack, 66, 41),
    "ln0_5000": (two_culprit_stack, 340, 211),
}
# 21,000 nodes: only when asked for by name (bench/speed_at_scale.py --huge)
HUGE = {"ln0_20000": (two_culprit_stack, 1400, 877)}
# the engine setting each class breaks with (the two-culprit stacks: the default engine)
ORT_CONFIG = {"ln0": None}


def ort_config(name: str):
    """The --ort-config entry the model breaks with, or None."""
    return ORT_CONFIG.get(name.split("_")[0], "optimization.enable_gelu_approximation=1")


def build(name: str, out: Path):
    fn, blocks, culprit = {**MODELS, **HUGE}[name]
    model, expected = fn(blocks, culprit)
    if fn is not two_culprit_stack:
        expected = [expected]
    import onnx

    onnx.save(model, str(out))
    input_name = model.graph.input[0].name
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"model": str(out), "nodes": len(model.graph.node), "expected": expected,
            "input": {input_name: shape}}


def _check(path: Path, info: dict, gelu: bool = True) -> str:
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
    for label, entries in (("all", ()), ("all+gelu-approx", (("optimization.enable_gelu_approximation", "1"),)))[: 2 if gelu else 1]:
        got = run(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, entries).astype(np.float64)
        ratio = float(np.max(np.abs(got - ref) / (1e-4 + 1e-4 * np.abs(ref))))
        out.append(f"{label}: x{ratio:.3g} of atol=rtol=1e-4")
    return "; ".join(out)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for name in (sys.argv[1:] or list(MODELS)):
            if name.startswith("ln0"):
                p = Path(d) / f"{name}.onnx"
                info = build(name, p)
                print(f"{name}: {info['nodes']} nodes; {_check(p, info, gelu=False)}")
                continue
            p = Path(d) / f"{name}.onnx"
            info = build(name, p)
            print(f"{name}: {info['nodes']} nodes; {_check(p, info)}")
