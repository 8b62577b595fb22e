"""Where onnx.reference computes a node against the spec, and the spec's formula for it.

The arbiter's truth is onnx's reference evaluator run in float64, and it is
only as right as the evaluator's kernels. One is wrong on real exports:
`BatchNormalization_9` of onnx.reference (opsets 9 to 13) runs inference mode
only `if momentum is None`, but OpRun fills every absent attribute with the
schema's default (momentum 0.9) before `_run`, so momentum is never None and
every opset-9..13 BatchNormalization runs in *training* mode: normalised with
the running statistics mixed 9:1 with the batch's own (mean*0.9 +
batch_mean*0.1, the same for the variance). The spec decides the mode by the
node's outputs (one output, Y: inference with the stored mean and variance;
opsets 14+ by `training_mode`). Not opset-12 attributes, not `spatial`, not
broadcasting: the mode. Paddle2ONNX exports at opsets 11-13, so PP-OCRv4 rec
parts 17.5 on a tensor of scale 34 at its first BatchNormalization, and (on the issue's input) PP-OCR
cls's two probabilities move from [0.0093, 0.9907] to [0.424, 0.576]. At
opsets 7-8 `BatchNormalization_6` trains unless `is_test`, an attribute those
opsets no longer have, and fails on its tuple. No tolerance hides that; the fix
is the spec's inference formula (`batch_norm_inference`), run from the start at
those nodes (`known_deviation`) and checked below like every other node; a
check left to find it (known fixes off) finds it at the first such node.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import onnx


def node_key(i: int, node: onnx.NodeProto) -> str:
    """A node's name, or its place where it has none (an override is found by it)."""
    return node.name or f"#{i}"


def _inference_form(node: onnx.NodeProto, opset: int) -> bool:
    """Whether the spec runs this BatchNormalization with its stored statistics."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if opset < 7:
        return bool(attrs.get("is_test", 0))
    if opset < 14:
        return len([o for o in node.output if o]) == 1
    return not attrs.get("training_mode", 0)


def batch_norm_inference(node: onnx.NodeProto, opset: int):
    """The spec's inference-mode BatchNormalization, any opset (None: the node trains)."""
    if not _inference_form(node, opset):
        return None
    eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)

    def run(x, scale, bias, mean, var):
        shape = (-1,) + (1,) * (np.ndim(x) - 2)
        y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape)
        return (y + bias.reshape(shape)).astype(x.dtype)

    return run


# op type -> (label, maker(node, opset) -> fn(*inputs) -> output, or None where it does not apply)
FORMULAS = {
    "BatchNormalization": ("numpy formula (inference-mode BatchNormalization, the spec's)", batch_norm_inference),
}


def _evaluator_trains_batch_norm(node: onnx.NodeProto, opset: int) -> bool:
    """onnx.reference's own mode rule: BatchNormalization_6 (opsets 6-8) trains unless
    `is_test`; BatchNormalization_9 (9-13) trains unless momentum is None, which it never
    is (the schema's default 0.9 fills it in); BatchNormalization_14 follows `training_mode`."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if opset < 9:
        return not attrs.get("is_test", 0)
    if opset < 14:
        return True
    return bool(attrs.get("training_mode", 0))


def known_deviation(node: onnx.NodeProto, opset: int) -> Optional[str]:
    """Why onnx.reference computes this node other than the spec says, where that is
    known (then the spec's formula runs it from the start), else None."""
    if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx"):
        return None
    if _inference_form(node, opset) and _evaluator_trains_batch_norm(node, opset):
        since = "momentum is never None once defaulted" if opset >= 9 else "the node has no is_test"
        return (f"onnx.reference runs opset-{opset} BatchNormalization in training mode, since {since}; "
                "the spec runs it, with one output, in inference mode")
    return None


def known_fixes(model64: onnx.ModelProto, opset: int) -> dict[str, tuple[str, Callable, str]]:
    """node key -> (label, the spec's formula, why) for every node of a known deviation."""
    out = {}
    for i, node in enumerate(model64.graph.node):
        why = known_deviation(node, opset)
        if why is not None:
            out[node_key(i, node)] = (FORMULAS[node.op_type][0], FORMULAS[node.op_type][1](node, opset), why)
    return out


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
