"""TensorRT translation layers, tested without TensorRT or a GPU.

The inspector fixtures under tests/fixtures/tensorrt/ are hand-written from
TensorRT's documented JSON (see their README); ONNX graphs are built with
onnx.helper; Polygraphy (installed here) is used for real where it runs
without TensorRT (Profile, CreateConfig construction). Nothing here claims a
TensorRT result: the GPU tests are in test_tensorrt_gpu.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisect_tui.core.errors import ExitCode, UserError
from bisect_tui.core.graph import GraphIndex
from bisect_tui.api import EngineConfig
from bisect_tui.engines.tensorrt.cache import EngineCache, cache_key
from bisect_tui.engines.tensorrt.features import features_from_names
from bisect_tui.engines.tensorrt.inspector import metadata_nodes, parse_inspector, precision_word
from bisect_tui.engines.tensorrt.layermap import fused_nodes_from_inspector
from bisect_tui.engines.tensorrt.layernames import NameRange, name_parts, nodes_from_name
from bisect_tui.engines.tensorrt.options import TrtOptions, validate
from bisect_tui.engines.tensorrt.precision import NetworkLayer, plan_keep_fp32
from bisect_tui.engines.tensorrt.profiles import build_profiles, parse_profile_range, to_polygraphy
from fixtures.tensorrt_helpers import InputStub, chain_model
from testlib import init, make_model, vi

FIX = Path(__file__).parent / "fixtures" / "tensorrt"


def branch_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["a0"], name="A_0"),
        helper.make_node("Sigmoid", ["x"], ["b_out"], name="B_1"),
        helper.make_node("Tanh", ["a0"], ["a2"], name="A_2"),
        helper.make_node("Concat", ["a2", "b_out"], ["y"], name="Concat_3", axis=1),
    ]
    return make_model(nodes, [vi("x", [1, 4])], [vi("y", [1, 8])])


def load_fixture(name):
    return parse_inspector((FIX / f"{name}.json").read_text())


# ------------------------------------------------------------------ inspector


def test_trt10_detailed_maps_by_tensors_then_metadata():
    layers = load_fixture("trt10_detailed")
    index = GraphIndex.build(chain_model())
    fused = fused_nodes_from_inspector(layers, index)
    got = {f.name: f.original_nodes for f in fused}
    assert got == {
        "Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1": [],
        "Conv_0 + Relu_1": ["Conv_0", "Relu_1"],
        "PWN(Add_2)": ["Add_2"],
        # proven by tensors: the walk from `out` back to `add_out` crosses all three
        "{ForeignNode[MatMul_3...Softmax_5]}": ["MatMul_3", "Mul_4", "Softmax_5"],
    }
    conv = fused[1]
    assert conv.is_fused and conv.op_type == "CaskConvolution" and conv.outputs == ["relu_out"]
    assert not fused[2].is_fused
    assert [la.precision for la in layers] == ["fp16", "fp16", "fp16", "fp32"]
    # every ONNX node is covered exactly once
    covered = [n for f in fused for n in f.original_nodes]
    assert sorted(covered) == sorted(n.name for n in chain_model().graph.node)


def test_trt11_split_datatype_keys_and_myelin_kernel_names():
    layers = load_fixture("trt11_myelin")
    assert [la.precision for la in layers] == ["fp16", "fp16", "fp16", "fp32"]
    assert layers[0].inputs[0].datatype == "Half Row major linear"
    fused = fused_nodes_from_inspector(layers, GraphIndex.build(chain_model()))
    assert [f.original_nodes for f in fused] == [
        ["Conv_0", "Relu_1"],  # tensors (x..relu_out) and metadata agree
        ["Add_2"],  # internal output: the name without its _myl0_0 suffix
        ["MatMul_3", "Mul_4"],  # metadata groups split on \x1e
        ["Softmax_5"],  # input is engine-internal: only the producer of `out`
    ]


def test_names_only_inspector_maps_by_layer_names():
    layers = load_fixture("names_only")
    assert [la.outputs for la in layers] == [[], [], [], []]
    fused = fused_nodes_from_inspector(layers, GraphIndex.build(chain_model()))
    assert [f.original_nodes for f in fused] == [
        [], ["Conv_0", "Relu_1"], ["Add_2"], ["MatMul_3", "Mul_4", "Softmax_5"]]


def test_foreign_node_range_leaves_a_parallel_branch_to_its_own_layer():
    index = GraphIndex.build(branch_model())
    assert [n.name for n in index.nodes] == ["A_0", "B_1", "A_2", "Concat_3"]
    fused = fused_nodes_from_inspector(load_fixture("branches"), index)
    assert [f.original_nodes for f in fused] == [["B_1"], ["A_0", "A_2", "Concat_3"]]


def test_layer_name_grammar():
    assert name_parts("Conv_0 + Relu_1") == ["Conv_0", "Relu_1"]
    assert name_parts("PWN(PWN(Sigmoid_3), Mul_4)") == ["Sigmoid_3", "Mul_4"]
    assert name_parts("{ForeignNode[/l1/MatMul.../l2/Add]}") == [NameRange("/l1/MatMul", "/l2/Add")]
    # a `+` inside brackets is not a separator
    assert name_parts("PWN(a + b) + c") == ["a", "b", "c"]
    index = GraphIndex.build(chain_model())
    # reversed ranges and unknown names: the range still resolves by graph order
    assert nodes_from_name("{ForeignNode[Softmax_5...MatMul_3]}", index) == ["MatMul_3", "Mul_4", "Softmax_5"]
    assert nodes_from_name("Conv_0 + no_such_node", index) == ["Conv_0"]
    assert nodes_from_name("(Unnamed Layer* 3) [Constant]", index) == []


def test_metadata_forms():
    assert metadata_nodes("[ONNX Layer: /a/Conv]\x1f[ONNX Layer: /a/Relu]") == ["/a/Conv", "/a/Relu"]
    assert metadata_nodes("[ONNX Layer: q][ONNX Layer: k]") == ["q", "k"]
    assert metadata_nodes("[ONNX Layer: odd]name]") == ["odd]name"]
    assert metadata_nodes("") == [] and metadata_nodes(None) == []
    assert precision_word("Row major linear FP32") == "fp32"
    assert precision_word("Channel major FP16 format where channel % 8 == 0") == "fp16"
    assert precision_word("Half") == "fp16" and precision_word("BFloat16") == "bf16"
    assert precision_word("Int8") == "int8" and precision_word("N/A due to dynamic shapes") == ""


def test_model_names_stay_data():
    """A node name that looks like code or markup is matched as a string only."""
    evil = "$(rm -rf ~) `x` [ONNX Layer: y]"
    m = make_model([helper.make_node("Relu", ["x"], ["r"], name=evil)], [vi("x", [1])], [vi("r", [1])])
    doc = {"Layers": [{"Name": evil, "LayerType": "PointWise", "Inputs": [], "Outputs": [{"Name": "zz"}],
                       "Metadata": f"[ONNX Layer: {evil}]"}]}
    fused = fused_nodes_from_inspector(parse_inspector(json.dumps(doc)), GraphIndex.build(m))
    assert fused[0].original_nodes == [evil]


# ------------------------------------------------------------------ FP32 pins


def test_keep_set_pins_network_layers_by_name_outputs_and_metadata():
    layers = [
        NetworkLayer("Conv_0", ("conv_out",), ("FLOAT",)),
        NetworkLayer("(Unnamed Layer* 7) [ElementWise]", ("t7",), ("FLOAT",), metadata="[ONNX Layer: Softmax_5]"),
        NetworkLayer("Softmax_5", ("out",), ("FLOAT",)),
        NetworkLayer("Softmax_5_1", ("t8",), ("FLOAT",)),  # parser's extra layer for the same node
        NetworkLayer("(Unnamed Layer* 9) [Shape]", ("mul_out_shape",), ("INT64",), metadata="[ONNX Layer: Softmax_5]"),
        NetworkLayer("(Unnamed Layer* 10)", ("mul_out",), ("FLOAT",)),  # writes Mul_4's output tensor
        NetworkLayer("Relu_1", ("relu_out",), ("FLOAT",)),
    ]
    node_outputs = {n.name: list(n.output) for n in chain_model().graph.node}
    plan = plan_keep_fp32(layers, ["Softmax_5", "Mul_4", "Gone_9"], node_outputs, strongly_typed=False)
    assert plan.mode == "layer_precisions"
    assert plan.pins == {"(Unnamed Layer* 7) [ElementWise]": "fp32", "Softmax_5": "fp32", "Softmax_5_1": "fp32",
                         "(Unnamed Layer* 10)": "fp32"}
    # the INT64 shape layer belongs to the node but is never pinned
    assert "(Unnamed Layer* 9) [Shape]" in plan.by_node["Softmax_5"]
    assert plan.unmatched == ["Gone_9"]
    assert "Conv_0" not in plan.pins and "Relu_1" not in plan.pins


def test_keep_set_on_strongly_typed_tensorrt_goes_to_the_model():
    plan = plan_keep_fp32([NetworkLayer("Softmax_5")], ["Softmax_5"], {}, strongly_typed=True)
    assert plan.mode == "typed_model" and plan.pins == {}
    assert plan_keep_fp32([], [], {}, strongly_typed=False).mode == "none"


def test_typed_model_conversion_keeps_the_keep_set_in_fp32(tmp_path):
    """TensorRT 11 path, real conversion (onnxruntime's FP16 converter)."""
    from bisect_tui.engines.tensorrt.engine import TensorRTEngine

    src = tmp_path / "m.onnx"
    onnx.save(chain_model(), str(src))
    feats = features_from_names("11.1.0", {"TF32", "REFIT"}, {"mark_debug", "mark_unfused_tensors_as_debug_tensors"})
    out = TensorRTEngine()._typed_source(feats, src, TrtOptions("fp16"), ["Softmax_5"], tmp_path)
    assert out != src and out.exists()
    conv = onnx.load(str(out))
    w = {i.name: i.data_type for i in conv.graph.initializer}
    assert w["W"] == TensorProto.FLOAT16 and w["B"] == TensorProto.FLOAT16
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(conv).graph.value_info}
    soft = next(n for n in conv.graph.node if n.name == "Softmax_5")
    assert types[soft.input[0]] == TensorProto.FLOAT  # a Cast in front keeps the softmax in FP32
    assert [o.type.tensor_type.elem_type for o in conv.graph.output] == [TensorProto.FLOAT]
    # TensorRT 10 with FP16 flags: the model is parsed as is, pins do the work
    feats10 = features_from_names("10.9.0", {"FP16", "BF16", "INT8", "TF32", "OBEY_PRECISION_CONSTRAINTS"}, {"mark_debug"})
    assert TensorRTEngine()._typed_source(feats10, src, TrtOptions("fp16"), ["Softmax_5"], tmp_path) == src


# ------------------------------------------------------------------ features


def test_feature_detection_tensorrt_10_and_11():
    # names as in include/NvInfer.h (v10.8, v10.16, v11.1), Python spellings
    v108 = features_from_names("10.8.0", {"FP16", "BF16", "INT8", "TF32", "OBEY_PRECISION_CONSTRAINTS"},
                               {"mark_output", "mark_debug"}, {"create_engine_inspector"})
    assert v108.layer_precisions and v108.mark_debug and not v108.mark_unfused_debug
    v1016 = features_from_names("10.16.0", {"FP16", "BF16", "INT8", "TF32", "OBEY_PRECISION_CONSTRAINTS"},
                                {"mark_debug", "mark_unfused_tensors_as_debug_tensors"}, {"create_engine_inspector"})
    assert v1016.layer_precisions and v1016.mark_unfused_debug and not v1016.always_strongly_typed
    v111 = features_from_names("11.1.0", {"TF32", "REFIT", "STRIP_PLAN"},
                               {"mark_debug", "mark_unfused_tensors_as_debug_tensors"}, {"create_engine_inspector"})
    assert v111.always_strongly_typed and not v111.layer_precisions and v111.precision_flags == {"TF32"}
    assert v111.to_dict()["layer_precisions"] is False

    from bisect_tui.engines.tensorrt.engine import capabilities_for

    assert "debug tensors" in capabilities_for(v1016).observation
    assert "may block fusion" in capabilities_for(v108).observation
    assert "converted to FP16" in capabilities_for(v111).keep_fp32
    assert "region isolation" in capabilities_for(v111).on_marking_failure


def test_without_tensorrt_the_engine_says_how_to_get_it(tmp_path):
    import importlib.util

    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is importable here; this checks the machine without it")
    from bisect_tui.engines.tensorrt.engine import TensorRTEngine

    eng = TensorRTEngine()
    cap = eng.installed_capabilities()
    assert not cap.available and "pip install -e '.[tensorrt]'" in cap.reason
    src = tmp_path / "m.onnx"
    onnx.save(chain_model(), str(src))
    with pytest.raises(UserError) as e:
        eng.build(src, EngineConfig(precision="fp16"))
    assert e.value.code == ExitCode.ENVIRONMENT and "TensorRT is not installed" in str(e.value)
    assert eng.versions()["tensorrt"] == "not installed"
    assert eng.unknown_passes(["ConvBNFusion"]) == ["ConvBNFusion"]


# ------------------------------------------------------------------ options


def qdq_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="Q_0"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="DQ_1"),
    ]
    return make_model(nodes, [vi("x", [1, 4])], [vi("y", [1, 4])],
                      [init("s", np.array(0.1, np.float32)), init("z", np.array(0, np.int8))])


def test_int8_without_calibration_cache_is_refused(tmp_path):
    with pytest.raises(UserError) as e:
        validate(TrtOptions("int8"), chain_model())
    msg = str(e.value)
    assert "\n" not in msg and "calibration cache" in msg and "QuantizeLinear" in msg
    assert e.value.code == ExitCode.USAGE
    validate(TrtOptions("int8"), qdq_model())  # explicit quantization needs no cache
    cache = tmp_path / "calib.cache"
    with pytest.raises(UserError, match="not found"):
        validate(TrtOptions("int8", calibration_cache=str(cache)), chain_model())
    cache.write_bytes(b"TRT-10000-EntropyCalibration2\n")
    validate(TrtOptions("int8", calibration_cache=str(cache)), chain_model())
    with pytest.raises(UserError, match="only used with --precision int8"):
        validate(TrtOptions("fp16", calibration_cache=str(cache)), chain_model())


def test_option_validation_and_polygraphy_config():
    with pytest.raises(UserError, match="unknown TensorRT precision"):
        validate(TrtOptions("fp8"))
    with pytest.raises(UserError, match="0..5"):
        validate(TrtOptions(builder_optimization_level=9))
    kw = TrtOptions("fp16").create_config_kwargs()
    assert kw == {"tf32": False, "fp16": True, "bf16": False, "int8": False, "precision_constraints": "obey"}
    assert TrtOptions("tf32").create_config_kwargs()["tf32"] is True
    # Polygraphy builds the config object lazily: this runs without TensorRT
    from polygraphy.backend.trt import CreateConfig

    cfg = CreateConfig(**kw)
    assert cfg.fp16 is True and cfg.precision_constraints == "obey" and cfg.tf32 is False
    assert TrtOptions.from_dict(TrtOptions("bf16", tf32=True).to_dict()) == TrtOptions("bf16", tf32=True)


# ------------------------------------------------------------------ cache


def test_cache_key_covers_model_options_and_switch():
    base = dict(model_digest="a" * 64, options={"precision": "fp16"}, marked=["t1", "t2"], keep_fp32=["n"],
                versions={"tensorrt": "10.9.0", "polygraphy": "0.53.6"})
    k = cache_key(**base)
    assert len(k) == 24 and set(k) <= set("0123456789abcdef")
    assert cache_key(**{**base, "marked": ["t2", "t1", "t1"]}) == k  # order and repeats do not matter
    variants = [
        {"model_digest": "b" * 64}, {"options": {"precision": "fp32"}}, {"marked": ["t1"]},
        {"keep_fp32": []}, {"disabled": ["x"]}, {"observe": "debug"},
        {"versions": {"tensorrt": "11.1.0", "polygraphy": "0.53.6"}},
    ]
    keys = {cache_key(**{**base, **v}) for v in variants}
    assert len(keys) == len(variants) and k not in keys


def test_engine_cache_reuses_only_verified_plans(tmp_path):
    cache = EngineCache(tmp_path / "engines")
    key = cache_key("c" * 64, {"precision": "fp16"})
    assert cache.get(key) is None
    plan = cache.put(key, b"\x00plan-bytes\xff", {"marked": 2})
    assert plan.read_bytes() == b"\x00plan-bytes\xff"
    assert cache.get(key) == b"\x00plan-bytes\xff" and cache.keys() == [key]
    meta = json.loads((tmp_path / "engines" / f"{key}.json").read_text())
    assert meta["size"] == 12 and meta["marked"] == 2 and len(meta["sha256"]) == 64
    plan.write_bytes(b"\x00plan-bytez\xff")  # same size, different bytes
    assert cache.get(key) is None
    cache.put(key, b"fresh", {})
    assert cache.get(key) == b"fresh"
    # a symlinked plan is never followed
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"fresh")
    plan.unlink()
    os.symlink(target, plan)
    assert cache.get(key) is None
    with pytest.raises(ValueError):
        cache.get("../../etc/passwd")


# ------------------------------------------------------------------ profiles


def test_profiles_from_user_shapes():
    inputs = [InputStub("x", ["batch", 3, None]), InputStub("mask", [1, 4])]
    specs = build_profiles(inputs, {"x": [2, 3, 16]})
    assert [(s.input, s.min, s.opt, s.max) for s in specs] == [
        ("x", (2, 3, 16), (2, 3, 16), (2, 3, 16)), ("mask", (1, 4), (1, 4), (1, 4))]
    prof = to_polygraphy(specs)
    assert len(prof) == 1 and list(prof[0]["x"]) == [[2, 3, 16]] * 3
    assert build_profiles([InputStub("m", [1, 4])], {}) == []  # static: no profile
    with pytest.raises(UserError, match="--shape x="):
        build_profiles(inputs, {})
    with pytest.raises(UserError, match="fixed at 3"):
        build_profiles(inputs, {"x": [2, 5, 16]})
    name, rng = parse_profile_range("x=1x3x8:2x3x16:4x3x32")
    specs = build_profiles(inputs, {"x": [2, 3, 16]}, {name: rng})
    assert (specs[0].min, specs[0].opt, specs[0].max) == ((1, 3, 8), (2, 3, 16), (4, 3, 32))
    with pytest.raises(UserError, match="min <= opt <= max"):
        build_profiles(inputs, {}, {"x": ((4, 3, 8), (2, 3, 8), (8, 3, 8))})
    with pytest.raises(UserError, match="MIN:OPT:MAX"):
        parse_profile_range("x=1x3")


def test_fusions_across_names_layers_that_hide_a_mark():
    """Marking `mm_out` as an output: in trt10_detailed the ForeignNode still
    spans MatMul_3 -> Mul_4 without writing `mm_out`, so it hides the mark."""
    from bisect_tui.engines.tensorrt.layermap import fusions_across

    index = GraphIndex.build(chain_model())
    fused = fused_nodes_from_inspector(load_fixture("trt10_detailed"), index)
    hidden = fusions_across(fused, ["mm_out"], index)
    assert [f.name for f in hidden] == ["{ForeignNode[MatMul_3...Softmax_5]}"]
    # relu_out is written by its layer: that mark is honoured
    assert fusions_across(fused, ["relu_out"], index) == []
    # conv_out is inside `Conv_0 + Relu_1`
    assert [f.name for f in fusions_across(fused, ["conv_out", "no_such"], index)] == ["Conv_0 + Relu_1"]
