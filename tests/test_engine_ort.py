"""OrtEngine and the fused-node map, checked against real ONNX Runtime sessions.

No ORT mocks: the point of the engine is to observe what the *installed* ORT
really fuses, so every test builds a small graph with onnx.helper and runs it.
Expectations that depend on the ORT release are written as "one of" where
releases differ, and as exact node names where the mapping must be exact.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisect_tui.core.errors import UserError
from bisect_tui.engines.registry import get_engine
import bisect_tui.engines.ort.session as ort_session
from bisect_tui.api import EngineConfig, FusedNode

from testlib import OLD_ORT_FUSIONS
from bisect_tui.engines.ort import (
    OrtEngine,
    confirm_optimizer_effect,
    fused_node_map,
    known_optimizers,
    optimizer_tags,
    unknown_optimizers,
)

D = 16
MATMUL = ["mm", "mm_add"]
GELU = ["g_div", "g_erf", "g_add", "g_mul", "g_out"]
LAYERNORM = [
    "ln_mean", "ln_sub", "ln_pow", "ln_var", "ln_addeps", "ln_sqrt", "ln_div", "ln_mul", "ln_add",
]
ALL_NODES = MATMUL + GELU + LAYERNORM
GELU_OPS = {"Gelu", "BiasGelu", "FastGelu"}
GELU_APPROX = (("optimization.enable_gelu_approximation", "1"),)


def _save(nodes, inits, path: Path, outputs=("y",), opset: int = 17) -> Path:
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, D])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 4, D]) for o in outputs],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8  # loadable by every ORT release we support
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def block_model(path: Path) -> Path:
    """MatMul+Add, erf-Gelu (Div, Erf, Add, Mul, Mul), decomposed LayerNorm: a BERT FFN tail."""
    rng = np.random.default_rng(0)

    def c(name, value):
        return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)

    inits = [
        c("W", rng.standard_normal((D, D)) * 0.3),
        c("B", rng.standard_normal(D) * 0.1),
        c("sqrt2", 1.4142135381698608),
        c("one", 1.0),
        c("half", 0.5),
        c("two", 2.0),
        c("eps", 1e-5),
        c("gamma", 1 + 0.1 * rng.standard_normal(D)),
        c("beta", 0.1 * rng.standard_normal(D)),
    ]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "W"], ["mm"], name="mm"),
        n("Add", ["mm", "B"], ["mm_add"], name="mm_add"),
        n("Div", ["mm_add", "sqrt2"], ["g_div"], name="g_div"),
        n("Erf", ["g_div"], ["g_erf"], name="g_erf"),
        n("Add", ["g_erf", "one"], ["g_add"], name="g_add"),
        n("Mul", ["mm_add", "g_add"], ["g_mul"], name="g_mul"),
        n("Mul", ["g_mul", "half"], ["g_out"], name="g_out"),
        n("ReduceMean", ["g_out"], ["ln_mean"], name="ln_mean", axes=[-1]),
        n("Sub", ["g_out", "ln_mean"], ["ln_sub"], name="ln_sub"),
        n("Pow", ["ln_sub", "two"], ["ln_pow"], name="ln_pow"),
        n("ReduceMean", ["ln_pow"], ["ln_var"], name="ln_var", axes=[-1]),
        n("Add", ["ln_var", "eps"], ["ln_addeps"], name="ln_addeps"),
        n("Sqrt", ["ln_addeps"], ["ln_sqrt"], name="ln_sqrt"),
        n("Div", ["ln_sub", "ln_sqrt"], ["ln_div"], name="ln_div"),
        n("Mul", ["ln_div", "gamma"], ["ln_mul"], name="ln_mul"),
        n("Add", ["ln_mul", "beta"], ["y"], name="ln_add"),
    ]
    return _save(nodes, inits, path)


@pytest.fixture(scope="module")
def block(tmp_path_factory) -> Path:
    return block_model(tmp_path_factory.mktemp("block") / "block.onnx")


@pytest.fixture(scope="module")
def feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((2, 4, D)).astype(np.float32)}


def build(path: Path, workdir: Path, marked=(), **cfg):
    return OrtEngine().build(path, EngineConfig(**cfg), marked=marked, workdir=workdir)


def by_op(nodes: list[FusedNode], ops) -> list[FusedNode]:
    return [f for f in nodes if f.op_type in ops]


def covered(nodes: list[FusedNode]) -> list[str]:
    return sorted(n for f in nodes for n in f.original_nodes)


# --------------------------------------------------------------------------- the map


@pytest.mark.parametrize("level", ["extended", "all"])
def test_map_of_fused_block_names_exact_pattern_nodes(block, tmp_path, level):
    built = build(block, tmp_path, level=level)
    nodes = built.fused_nodes
    (ln,) = by_op(nodes, {"LayerNormalization"})
    assert ln.original_nodes == LAYERNORM
    assert ln.outputs == ["y"]  # the fused node keeps the last original node's output name
    (gelu,) = by_op(nodes, GELU_OPS)
    (mm,) = by_op(nodes, {"Gemm", "MatMul", "FusedMatMul"})
    if gelu.op_type == "BiasGelu":  # releases without 3-D MatMulAddFusion fuse the bias here
        assert gelu.original_nodes == ["mm_add"] + GELU
        assert mm.original_nodes == ["mm"]
    else:  # 1.32: Reshape -> Gemm -> Reshape; the Gemm, not the Reshape, covers MatMul+Add
        assert gelu.original_nodes == GELU
        assert mm.original_nodes == MATMUL
    # every original node is covered exactly once; glue nodes cover nothing
    assert covered(nodes) == sorted(ALL_NODES)
    for f in nodes:
        if f not in (ln, gelu, mm):
            assert f.original_nodes == [], f
            assert f.op_type in {"Reshape", "Transpose", "Cast"}
    assert ln.is_fused and gelu.is_fused
    assert mm.is_fused == (len(mm.original_nodes) > 1)
    # tags are read from names like "ln_mul/LayerNormFusion/" where the release writes them
    if "/LayerNormFusion" in ln.name:
        assert ln.passes == ["LayerNormFusion"]
    built.close()


def test_map_at_disable_is_identity(block, tmp_path):
    nodes = build(block, tmp_path, level="disable").fused_nodes
    assert [f.name for f in nodes] == ALL_NODES
    for f in nodes:
        assert f.original_nodes == [f.name]
        assert f.passes == [] and not f.is_fused


def test_map_at_basic_leaves_gelu_alone(block, tmp_path):
    nodes = build(block, tmp_path, level="basic").fused_nodes
    assert not by_op(nodes, GELU_OPS)  # Gelu is a contrib op: level 2 only
    for name in GELU:
        (f,) = [f for f in nodes if f.name == name]
        assert f.original_nodes == [name]
    assert covered(nodes) == sorted(ALL_NODES)


def conv_model(path: Path) -> Path:
    """Conv+BN+Relu, Conv+Relu, residual Add, Conv: what NCHWc rewrites at level "all"."""
    rng = np.random.default_rng(0)
    c = D
    inits = [
        numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32), f"w{i}")
        for i in range(3)
    ]
    for name, value in (("s", 1.0), ("b", 0.1), ("m", 0.0), ("v", 1.0)):
        inits.append(numpy_helper.from_array(np.full(c, value, np.float32), name))
    n = helper.make_node
    pads = [1, 1, 1, 1]
    nodes = [
        n("Conv", ["x", "w0"], ["c0"], name="c0", pads=pads),
        n("BatchNormalization", ["c0", "s", "b", "m", "v"], ["bn0"], name="bn0"),
        n("Relu", ["bn0"], ["r0"], name="r0"),
        n("Conv", ["r0", "w1"], ["c1"], name="c1", pads=pads),
        n("Relu", ["c1"], ["r1"], name="r1"),
        n("Add", ["r1", "r0"], ["a"], name="add"),
        n("Conv", ["a", "w2"], ["y"], name="c2", pads=pads),
    ]
    g = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8, 8])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_map_stays_fine_grained_through_nchwc_layout(tmp_path):
    # x86 CPUs get the NCHWc rewrite (nodes named `<tensor>_nchwc` between
    # ReorderInput/ReorderOutput); elsewhere FusedConv. Either way each conv
    # pattern is its own fused node, not one blob for the whole trunk.
    path = conv_model(tmp_path / "conv.onnx")
    nodes = build(path, tmp_path, level="all").fused_nodes
    by_first = {f.original_nodes[0]: f.original_nodes for f in nodes if f.original_nodes}
    assert by_first == {
        "c0": ["c0", "bn0", "r0"],
        "c1": ["c1", "r1"],
        "add": ["add"],
        "c2": ["c2"],
    }


def test_fused_node_map_on_protos_and_helpers(block, tmp_path):
    built = build(block, tmp_path, level="all")
    original = onnx.load(str(block))
    optimized = onnx.load(str(built.optimized_model_path))
    again = fused_node_map(original, optimized, known_optimizers())
    assert [f.to_dict() for f in again] == [f.to_dict() for f in built.fused_nodes]
    assert [FusedNode.from_dict(f.to_dict()) for f in again] == again


def test_optimizer_tags():
    known = {"MatMulAddFusion", "LayerNormFusionL1"}
    assert optimizer_tags("mm1/MatMulAddFusion/GemmTransposeFusion/", known) == [
        "MatMulAddFusion",
        "GemmTransposeFusion",
    ]
    assert optimizer_tags("ln_mul/LayerNormFusionL1/", set()) == ["LayerNormFusionL1"]
    assert optimizer_tags("x/MatMulAddFusion_token_3", known) == ["MatMulAddFusion"]
    assert optimizer_tags("/model/layers.0/mlp/MatMul", known) == []
    assert optimizer_tags("Gelu", known) == []


# --------------------------------------------------------------------------- optimizers


def test_known_and_unknown_optimizers():
    known = known_optimizers()
    assert "GeluApproximation" in known
    assert any(n.startswith("LayerNormFusion") for n in known)
    assert unknown_optimizers(["NoSuchFusion"]) == ["NoSuchFusion"]
    assert unknown_optimizers(["GeluApproximation", "NoSuchFusion"]) == ["NoSuchFusion"]
    assert OrtEngine().known_passes() == set(known)
    v = OrtEngine().versions()
    assert {"onnxruntime", "onnx", "numpy", "providers"} <= set(v)
    assert "CPUExecutionProvider" in v["providers"]


def test_disabling_layernorm_fusion_by_learnt_name(block, tmp_path, feeds):
    names = sorted(n for n in known_optimizers() if n.startswith("LayerNormFusion"))
    fused = build(block, tmp_path, level="all")
    assert by_op(fused.fused_nodes, {"LayerNormalization"})
    off = build(block, tmp_path, level="all", disabled_passes=tuple(names))
    assert not by_op(off.fused_nodes, {"LayerNormalization"})
    # the other fusions are untouched, and the decomposed LN nodes are still all covered
    assert by_op(off.fused_nodes, GELU_OPS)
    assert covered(off.fused_nodes) == sorted(ALL_NODES)
    y0, y1 = fused.run(feeds)["y"], off.run(feeds)["y"]
    np.testing.assert_allclose(y0, y1, atol=1e-5)

    proof = confirm_optimizer_effect(
        block, EngineConfig(level="all"), names + ["NoSuchFusion"], tmp_path
    )
    assert any(proof[n] for n in names)  # at least one learnt name really switches it off
    assert proof["NoSuchFusion"] is False  # ORT ignored it without a word


# --------------------------------------------------------------------------- marking


def test_marking_an_interior_gelu_tensor_blocks_the_gelu_fusion(block, tmp_path, feeds):
    built = build(block, tmp_path, marked=["g_erf", "not_a_tensor"], level="all")
    assert built.output_names == ["y", "g_erf"]
    assert built.unmarkable == ["not_a_tensor"]
    nodes = built.fused_nodes
    assert not by_op(nodes, GELU_OPS)
    for name in ["g_div", "g_erf", "g_add", "g_mul", "g_out"]:
        (f,) = [f for f in nodes if f.name == name]
        assert f.original_nodes == [name]
    # fusions that do not swallow the marked tensor still happen
    (ln,) = by_op(nodes, {"LayerNormalization"})
    assert ln.original_nodes == LAYERNORM
    out = built.run(feeds)
    assert set(out) == {"y", "g_erf"}
    ref = build(block, tmp_path, marked=["g_erf"], level="disable").run(feeds)
    np.testing.assert_allclose(out["g_erf"], ref["g_erf"], atol=1e-6)


def test_marking_the_last_tensor_of_a_pattern_keeps_the_fusion(block, tmp_path):
    built = build(block, tmp_path, marked=["g_out", "W"], level="all")
    assert built.output_names == ["y", "g_out", "W"]
    assert by_op(built.fused_nodes, GELU_OPS)


# --------------------------------------------------------------------------- numerics


def test_gelu_approximation(block, tmp_path, feeds):
    exact = build(block, tmp_path, marked=["g_out"], level="all")
    approx = build(block, tmp_path, marked=["g_out"], level="all", config_entries=GELU_APPROX)
    (gelu,) = by_op(approx.fused_nodes, GELU_OPS)
    assert gelu.op_type == "FastGelu"  # measured on 1.32 and 1.16 (tanh approximation)
    # 1.32 keeps the bias in the Gemm; 1.16 folds it into FastGelu(x, bias)
    assert gelu.original_nodes == (["mm_add"] + GELU if OLD_ORT_FUSIONS else GELU)
    a, b = exact.run(feeds), approx.run(feeds)
    err = float(np.abs(a["g_out"] - b["g_out"]).max())
    # measured 4.70e-4 on ORT 1.32 (by design, documented as up to ~5e-4)
    assert 1e-4 < err < 1e-3
    assert float(np.abs(a["y"] - b["y"]).max()) > 1e-5  # LayerNorm amplifies it (2.3e-3)


def test_saved_optimized_model_reproduces_bit_for_bit(block, tmp_path, feeds):
    fused = build(block, tmp_path, level="all", config_entries=GELU_APPROX)
    reloaded = build(fused.optimized_model_path, tmp_path, level="disable")
    assert np.array_equal(fused.run(feeds)["y"], reloaded.run(feeds)["y"])
    # and the baseline is a different program (approximation changes numbers)
    base = build(block, tmp_path, level="disable")
    assert not np.array_equal(base.run(feeds)["y"], fused.run(feeds)["y"])


def test_fp16_build_runs_close_to_fp32_and_maps_to_fp32_nodes(block, tmp_path, feeds):
    ref = build(block, tmp_path, level="disable").run(feeds)
    f16 = build(block, tmp_path, level="all", precision="fp16", marked=["g_div"])
    out = f16.run(feeds)
    assert out["y"].dtype == np.float32  # keep_io_types
    assert out["g_div"].dtype == np.float16  # a marked tensor has its fp16 type
    np.testing.assert_allclose(out["y"], ref["y"], atol=1e-2)
    nodes = f16.fused_nodes
    for f in by_op(nodes, {"Cast"}):
        assert f.original_nodes == []
    assert covered(nodes) == sorted(ALL_NODES)
    for ln in by_op(nodes, {"LayerNormalization"}):  # fused in fp16 by 1.32, not by 1.16
        assert ln.original_nodes == LAYERNORM
    for f in nodes:
        if f.op_type != "Cast" and f.name in ALL_NODES and len(f.original_nodes) == 1:
            assert f.original_nodes == [f.name]  # fp16 nodes map to their fp32 twins
    # the converted model is cached by source hash: a second build does not reconvert
    cached = list(tmp_path.glob("fp16_*.onnx"))
    assert len(cached) == 1
    stamp = cached[0].stat().st_mtime_ns
    build(block, tmp_path, level="basic", precision="fp16")
    assert cached[0].stat().st_mtime_ns == stamp


def test_fp16_relu_still_covers_the_original_relu(tmp_path, feeds):
    bias = numpy_helper.from_array(np.full(D, 0.25, np.float32), "bias")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "bias"], ["y"], name="add"),
    ]
    path = _save(nodes, [bias], tmp_path / "relu.onnx")
    built = build(path, tmp_path, level="all", precision="fp16")
    mapped = {f.name: f for f in built.fused_nodes}
    assert mapped["relu"].original_nodes == ["relu"]
    assert covered(built.fused_nodes) == ["add", "relu"]
    assert all(f.original_nodes == [] for f in by_op(built.fused_nodes, {"Cast"}))
    np.testing.assert_allclose(
        built.run(feeds)["y"], np.maximum(feeds["x"], 0) + 0.25, atol=2e-3
    )


def test_large_model_path_uses_external_data(block, tmp_path, feeds, monkeypatch):
    # pretend every model is "over 2 GB" to exercise the external-data path for real
    monkeypatch.setattr(ort_session, "EXTERNAL_DATA_THRESHOLD", 0)
    built = build(block, tmp_path, marked=["g_out"], level="all")
    names = {p.name for p in tmp_path.iterdir()}
    assert any(n.startswith("build_") and n.endswith(".onnx.data") for n in names)
    assert any(n.startswith("optimized_") and n.endswith(".onnx.data") for n in names)
    ref = build(block, tmp_path / "plain", marked=["g_out"], level="all").run(feeds)
    assert np.array_equal(built.run(feeds)["y"], ref["y"])
    assert by_op(built.fused_nodes, {"LayerNormalization"})


def test_owned_temp_dir_is_removed_on_close(block, feeds):
    built = get_engine("ort").build(block, EngineConfig(level="all"))
    path = built.optimized_model_path
    assert path is not None and path.exists()
    built.run(feeds)
    built.close()
    assert not path.exists()


# --------------------------------------------------------------------------- errors


def test_bad_config_entry_is_a_user_error(block, tmp_path):
    with pytest.raises(UserError, match="^ONNX Runtime could not build the fused engine: ") as e:
        build(
            block, tmp_path, config_entries=(("optimization.minimal_build_optimizations", "foo"),)
        )
    assert "\n" not in str(e.value)


def test_broken_models_are_user_errors(tmp_path):
    nodes = [helper.make_node("NoSuchOp", ["x"], ["y"], name="bad")]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    bad = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(bad))
    with pytest.raises(UserError, match="could not build the fused engine") as e:
        build(bad, tmp_path)
    assert "\n" not in str(e.value)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00 this is not a protobuf \xff" * 10)
    with pytest.raises(UserError):
        build(garbage, tmp_path)
    with pytest.raises(UserError):
        build(garbage, tmp_path, marked=["y"])  # the path that loads the model with onnx
    with pytest.raises(UserError, match="not found"):
        build(tmp_path / "missing.onnx", tmp_path)


def test_bad_level_precision_provider_are_user_errors(block, tmp_path):
    with pytest.raises(UserError, match="level"):
        build(block, tmp_path, level="max")
    with pytest.raises(UserError, match="precision"):
        build(block, tmp_path, precision="int4")
    with pytest.raises(UserError, match="NoSuchExecutionProvider"):
        build(block, tmp_path, options=(("providers", '["NoSuchExecutionProvider"]'),))


# --------------------------------------------------------------------------- execution providers

_EPS = ["cuda", "tensorrt", "openvino", "dnnl"]


@pytest.mark.parametrize("short", _EPS)
def test_execution_provider_option_runs_when_installed_and_refuses_cleanly_when_not(short, samples, tmp_path,
                                                                                  capsys):
    """`--ort-provider NAME` puts that provider before the CPU fallback; one the
    installed onnxruntime lacks is refused with one line (ORT itself would warn
    and silently run on CPU, comparing the wrong engine)."""
    import onnxruntime

    from bisect_tui.cli import main
    from bisect_tui.engines.ort import PROVIDER_NAMES

    full = PROVIDER_NAMES[short]
    code = main(["check", str(samples / "cnn.onnx"), "--ort-provider", short, "--session", str(tmp_path / "s"),
                 "--json", str(tmp_path / "r.json"), "-q"])
    err = capsys.readouterr().err
    if full not in onnxruntime.get_available_providers():
        assert code == 2 and f"execution provider {full} is not available" in err
        pytest.skip(f"{full} is not in this onnxruntime build ({onnxruntime.__version__}); refusal checked")
    assert code in (0, 1), err
    import json

    assert json.loads((tmp_path / "r.json").read_text())["config"]["providers"] == [full, "CPUExecutionProvider"]


def test_misspelt_session_config_key_is_refused_with_a_suggestion(samples, tmp_path, capsys):
    from bisect_tui.cli import main

    code = main(["check", str(samples / "cnn.onnx"), "--ort-config", "optimization.enable_gelu_aproximation=1",
                 "--session", str(tmp_path / "s"), "-q"])
    err = capsys.readouterr().err
    assert code == 2
    assert "does not know this session config key" in err and "optimization.enable_gelu_approximation" in err


def test_sessions_are_made_without_spinning_pool_threads_unless_asked(block, tmp_path, feeds):
    """ORT's pool threads spin after each parallel op by default, taking a core from
    the builds and the Python beside them: every session this tool makes turns it
    off, and a user's own --ort-config value for it is kept."""
    from bisect_tui.engines.ort.unfused import make_session

    key = "session.intra_op.allow_spinning"
    opts = lambda s: s.get_session_options()  # noqa: E731
    assert opts(build(block, tmp_path, level="all")._session).get_session_config_entry(key) == "0"
    mine = build(block, tmp_path / "u", level="all", config_entries=((key, "1"),))
    assert opts(mine._session).get_session_config_entry(key) == "1"
    assert opts(make_session(onnx.load(str(block)))).get_session_config_entry(key) == "0"
    # and the values are the same either way
    a = build(block, tmp_path / "a", level="all").run(feeds)
    np.testing.assert_array_equal(a["y"], mine.run(feeds)["y"])
