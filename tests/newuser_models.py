"""Small models with what real models have and the sample does not: symbolic
dims, placeholder dims ('?'), a sample-rate int64 scalar, a bool flag, an
integer input that must be a real value, an image size the model insists on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from testlib import init, make_model, vi


def vad_like(path: Path) -> Path:
    """input[batch, sequence], state[2, batch, 4], sr (int64 scalar), flag (bool scalar).

    out = input * (sr / 16000) + sum(state), or 0 where flag is false; sr also
    picks the frame count the way VAD models do, so a random sr fails at run time."""
    nodes = [
        helper.make_node("Cast", ["sr"], ["srf"], name="sr_float", to=TensorProto.FLOAT),
        helper.make_node("Div", ["srf", "k16000"], ["scale"], name="scale"),
        helper.make_node("Mul", ["input", "scale"], ["scaled"], name="apply_scale"),
        helper.make_node("ReduceSum", ["state"], ["ssum"], name="state_sum", keepdims=0),
        helper.make_node("Add", ["scaled", "ssum"], ["mixed"], name="mix"),
        helper.make_node("Cast", ["flag"], ["flagf"], name="flag_float", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["mixed", "flagf"], ["gated"], name="gate"),
        # frames = sr / 16000 rows of the sequence: 1 at 16 kHz, 0 (an empty Reshape) otherwise
        helper.make_node("Div", ["sr", "i16000"], ["frames"], name="frames"),
        helper.make_node("Unsqueeze", ["frames", "ax0"], ["frames1"], name="frames1"),
        helper.make_node("Concat", ["frames1", "minus1"], ["fshape"], name="fshape", axis=0),
        helper.make_node("Reshape", ["gated", "fshape"], ["out"], name="to_frames"),
    ]
    m = make_model(
        nodes,
        [vi("input", ["batch", "sequence"]), vi("state", [2, "batch", 4]),
         vi("sr", [], TensorProto.INT64), vi("flag", [], TensorProto.BOOL)],
        [vi("out", ["frames", "n"])],
        [init("k16000", np.array(16000.0, np.float32)), init("i16000", np.array(16000, np.int64)),
         init("ax0", np.array([0], np.int64)), init("minus1", np.array([-1], np.int64))],
    )
    onnx.save(m, path)
    return path


def rows_by_input(path: Path) -> Path:
    """Rows of relu(x[2, 4]) picked by the int64 input `rows`: the table is computed,
    not a weight, so nothing bounds the guess and random 0..9 fall outside 2 rows."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Gather", ["r", "rows"], ["y"], name="pick", axis=0)]
    m = make_model(nodes, [vi("x", [2, 4]), vi("rows", [3], TensorProto.INT64)], [vi("y", [3, 4])])
    onnx.save(m, path)
    return path


def text_line_image(path: Path) -> Path:
    """x[?, 3, ?, ?] (exporter placeholders) flattened into a 3*48*320 -> 2 MatMul:
    only a 48x320 image (a text line) runs, so the probe must try past its first guess."""
    w = np.random.default_rng(0).standard_normal((3 * 48 * 320, 2)).astype(np.float32) * 0.01
    nodes = [helper.make_node("Flatten", ["x"], ["f"], name="flatten", axis=1),
             helper.make_node("MatMul", ["f", "w"], ["y"], name="head")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["?", 3, "?", "?"])
    m = make_model(nodes, [x], [vi("y", ["n", 2])], [init("w", w)])
    onnx.save(m, path)
    return path
