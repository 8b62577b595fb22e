"""Inputs: shapes for dynamic dims, seeded generation, loading and validating files."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisect_tui.core.errors import UserError
from bisect_tui.core.input_suggest import resolve_shapes
from bisect_tui.core.inputs import generate_inputs, load_inputs, parse_shapes
from bisect_tui.core.model import load_model_info

from testlib import init, make_model, vi


@pytest.fixture
def dyn_model(tmp_path):
    """ids[batch, seq] int64 -> Gather from a 50-row table; mask[batch, seq] bool."""
    table = np.arange(50 * 4, dtype=np.float32).reshape(50, 4)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
        helper.make_node("Cast", ["mask"], ["maskf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axes"], ["mask3"], name="unsq"),
        helper.make_node("Mul", ["emb", "mask3"], ["y"], name="apply"),
    ]
    m = make_model(
        nodes,
        [vi("ids", ["batch", "seq"], TensorProto.INT64), vi("mask", ["batch", "seq"], TensorProto.BOOL)],
        [vi("y", ["batch", "seq", 4])],
        [init("table", table), init("axes", np.array([2], dtype=np.int64))],
    )
    p = tmp_path / "dyn.onnx"
    onnx.save(m, p)
    return load_model_info(p)


def test_dynamic_dim_without_shape_names_the_dim(dyn_model):
    with pytest.raises(UserError) as e:
        resolve_shapes(dyn_model, {})
    msg = str(e.value)
    assert "'batch'" in msg and "axis 0" in msg and "--shape ids=1x1" in msg
    assert "\n" not in msg


def test_named_dims_and_input_shapes(dyn_model):
    assert resolve_shapes(dyn_model, parse_shapes(["batch=2", "seq=5"])) == {"ids": [2, 5], "mask": [2, 5]}
    got = resolve_shapes(dyn_model, parse_shapes(["ids=3x4", "mask=3x4"]))
    assert got == {"ids": [3, 4], "mask": [3, 4]}
    with pytest.raises(UserError, match="rank 3"):
        resolve_shapes(dyn_model, parse_shapes(["ids=1x2x3", "mask=1x2"]))
    with pytest.raises(UserError, match="neither an input"):
        resolve_shapes(dyn_model, parse_shapes(["bogus=3"]))
    with pytest.raises(UserError, match="bad --shape"):
        parse_shapes(["ids=3xfoo"])


def test_generated_inputs_respect_gather_bounds_and_masks(dyn_model):
    shapes = resolve_shapes(dyn_model, parse_shapes(["batch=4", "seq=64"]))
    a = generate_inputs(dyn_model, shapes, seed=7, samples=3)
    ids, mask = a.arrays["ids"], a.arrays["mask"]
    assert ids.shape == (3, 4, 64) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < 50 and ids.max() > 25  # uses the table's range
    assert mask.dtype == bool and mask.all()
    b = generate_inputs(dyn_model, shapes, seed=7, samples=3)
    assert np.array_equal(a.arrays["ids"], b.arrays["ids"])  # same seed, same input
    c = generate_inputs(dyn_model, shapes, seed=8, samples=3)
    assert not np.array_equal(a.arrays["ids"], c.arrays["ids"])


def test_load_inputs_checks_names_dtypes_and_shapes(tiny_model, tmp_path):
    info = load_model_info(tiny_model)
    good = np.ones((2, 8), np.float32)
    np.save(tmp_path / "one.npy", good)
    s = load_inputs(info, tmp_path / "one.npy")
    assert s.samples == 1 and s.arrays["x"].shape == (1, 2, 8)
    np.savez(tmp_path / "many.npz", x=np.ones((5, 2, 8), np.float32))
    assert load_inputs(info, tmp_path / "many.npz").samples == 5

    np.save(tmp_path / "f64.npy", good.astype(np.float64))
    with pytest.raises(UserError, match="is float64, the model expects float32"):
        load_inputs(info, tmp_path / "f64.npy")
    np.save(tmp_path / "shape.npy", np.ones((3, 8), np.float32))
    with pytest.raises(UserError, match=r"axis 0: 3 != 2"):
        load_inputs(info, tmp_path / "shape.npy")
    np.savez(tmp_path / "names.npz", input=good)
    with pytest.raises(UserError, match="missing x; unexpected input"):
        load_inputs(info, tmp_path / "names.npz")
    with pytest.raises(UserError, match="not found"):
        load_inputs(info, tmp_path / "nope.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(UserError, match="cannot read input file"):
        load_inputs(info, tmp_path / "junk.npz")


def test_model_errors_are_one_line(tmp_path):
    with pytest.raises(UserError, match="model file not found"):
        load_model_info(tmp_path / "missing.onnx")
    (tmp_path / "text.onnx").write_text("hello, I am not a protobuf\n" * 10)
    with pytest.raises(UserError, match="not an ONNX model"):
        load_model_info(tmp_path / "text.onnx")
    bad = make_model([helper.make_node("Relu", ["nope"], ["y"], name="r")], [vi("x", [2])], [vi("y", [2])])
    onnx.save(bad, tmp_path / "bad.onnx")
    with pytest.raises(UserError, match="invalid ONNX model") as e:
        load_model_info(tmp_path / "bad.onnx")
    assert "\n" not in str(e.value)
