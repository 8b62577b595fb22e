"""A suggested input shape is described as what it is: ddddocr's `input1`
(1 x 1 x 64 x image_width, a grayscale text line) was called "a 224x224 image"."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisect_tui.core.input_suggest import InputsNeedValues, resolve_shapes
from bisect_tui.core.model import load_model_info
from bisect_tui.engines.ort.unfused import OrtUnfused

from testlib import init, make_model


def _conv_model(path, channels, height, width):
    w = np.random.default_rng(0).standard_normal((4, channels, 3, 3)).astype(np.float32)
    m = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                    helper.make_node("ReduceMean", ["c"], ["y"], keepdims=0)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, height, width])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [init("w", w)])
    onnx.save(m, str(path))
    return load_model_info(path)


def _suggestion(info) -> str:
    with pytest.raises(InputsNeedValues) as e:
        resolve_shapes(info, {}, reference=OrtUnfused())
    return str(e.value)


def test_a_grayscale_text_line_is_called_one(tmp_path):
    msg = _suggestion(_conv_model(tmp_path / "line.onnx", 1, 64, "image_width"))
    assert "--shape x=1x1x64x224" in msg
    assert "a grayscale image 64 high, 224 wide, its height fixed by the model: a text line" in msg
    assert "224x224" not in msg and "it ran in a quick probe" in msg


def test_a_free_rgb_image_and_a_fixed_width(tmp_path):
    msg = _suggestion(_conv_model(tmp_path / "rgb.onnx", 3, "h", "w"))
    assert "--shape x=1x3x224x224" in msg
    assert "an RGB image 224 high, 224 wide" in msg and "fixed by the model" not in msg
    msg = _suggestion(_conv_model(tmp_path / "tall.onnx", 3, "h", 100))
    assert "--shape x=1x3x224x100" in msg and "its width fixed by the model" in msg and "text line" not in msg
