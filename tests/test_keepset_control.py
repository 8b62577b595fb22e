"""The FP16 keep-set instrument proves itself (issue 21).

Real onnxruntime, real torch export: with every node kept in FP32 the ORT FP16
model must give the FP32 result (bit for bit at ORT_DISABLE_ALL), on a torch
TransformerEncoder and on a Paddle2ONNX-style model whose weights are unnamed
`Constant` nodes; onnxruntime's converter alone does not (the tests say by how
much, so they can fail). A keep-set search on the TransformerEncoder ends with
a keep-set that passes with a plain ORT session and the bundle's own script;
with the old instrument the search says its control failed instead of
concluding about the model."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ort = pytest.importorskip("onnxruntime")

from bisect_tui.engines.ort import fp16  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _run(model: onnx.ModelProto, feeds: dict, level=None) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = level or ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _max_abs(a: list, b: list) -> float:
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) for x, y in zip(a, b))


def _casts_to_fp16(model: onnx.ModelProto) -> int:
    return sum(1 for n in model.graph.node if n.op_type == "Cast"
               and any(a.name == "to" and a.i == TensorProto.FLOAT16 for a in n.attribute))


@pytest.fixture(scope="module")
def transformer(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    path = tmp_path_factory.mktemp("te") / "te.onnx"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(enc, (torch.randn(1, 16, 32),), str(path), input_names=["x"], output_names=["y"],
                          dynamo=False, opset_version=17)
    return path


def paddle_like() -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> MatMul -> Add, opset 12, every weight in
    an unnamed Constant node (as Paddle2ONNX writes them), one BN variance of 9.79e7
    (PP-OCRv4 det's batch_norm_0.w_2: inf in FP16) and one weight shared by two nodes."""
    rng = np.random.default_rng(3)

    def const(name, a):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(a.astype(np.float32), name))

    var = np.abs(rng.standard_normal(8)) + 0.5
    var[2] = 9.79e7
    nodes = [
        const("w_conv", rng.standard_normal((8, 3, 3, 3)) * 0.3),
        const("bn_scale", rng.standard_normal(8)), const("bn_bias", rng.standard_normal(8)),
        const("bn_mean", rng.standard_normal(8) * 0.1), const("bn_var", var),
        const("w_fc", rng.standard_normal((6, 6)) * 0.4), const("b_fc", rng.standard_normal(6) * 1e-3 + 3e-5),
        helper.make_node("Conv", ["x", "w_conv"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MatMul", ["r", "w_fc"], ["m"]),
        helper.make_node("Add", ["m", "b_fc"], ["a"]),
        helper.make_node("MatMul", ["a", "w_fc"], ["y"]),  # w_fc read twice
    ]
    g = helper.make_graph(nodes, "paddle_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)], ir_version=7)
    onnx.checker.check_model(m)
    return m


def _through_identity(model: onnx.ModelProto, name: str) -> str:
    """The value an input really reads: the converter's repaired casts are Identities."""
    producer = {o: n for n in model.graph.node for o in n.output}
    while name in producer and producer[name].op_type == "Identity":
        name = producer[name].input[0]
    return name


def _every_node(model: onnx.ModelProto) -> list[str]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    fp16.name_nodes(m)
    return [n.name for n in m.graph.node]


def _ort_converter_only(model: onnx.ModelProto, keep: list[str]) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    m = onnx.ModelProto()
    m.CopyFrom(model)
    fp16.name_nodes(m)
    return convert_float_to_float16(m, keep_io_types=True, node_block_list=keep)


def test_keep_everything_reproduces_fp32_on_a_torch_transformer(transformer):
    model = onnx.load(str(transformer))
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 16, 32)).astype(np.float32)}
    ref = _run(model, feeds)
    every = _every_node(model)
    kept, done = fp16.convert(model, every)
    assert _casts_to_fp16(kept) == 0 and done["kept"] == len(every) - done["constants_lifted"]
    assert _max_abs(_run(kept, feeds), ref) == 0.0  # bit for bit: nothing ran in FP16
    # the engine at level all too: the same as ORT FP32 at level all
    all_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert _max_abs(_run(kept, feeds, all_level), _run(model, feeds, all_level)) == 0.0
    # onnxruntime's converter alone (the old instrument): still FP16 everywhere
    old = _ort_converter_only(model, every)
    assert _casts_to_fp16(old) > 50 and _max_abs(_run(old, feeds), ref) > 1e-4
    # nothing kept: FP16 for real, about as far off as the old "keep everything"
    none, _ = fp16.convert(model)
    assert _max_abs(_run(none, feeds), ref) > 1e-4


def test_keep_everything_reproduces_fp32_with_constant_node_weights():
    model = paddle_like()
    assert not any(n.name for n in model.graph.node)  # unnamed, as Paddle2ONNX writes them
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)}
    ref = _run(model, feeds)
    every = _every_node(model)
    kept, done = fp16.convert(model, every)
    assert done["nodes_named"] == 13 and done["constants_lifted"] == 7 and not done["kept_unknown"]
    assert _casts_to_fp16(kept) == 0 and _max_abs(_run(kept, feeds), ref) == 0.0
    old = _ort_converter_only(model, every)
    assert not np.isfinite(_run(old, feeds)[0]).all() or _max_abs(_run(old, feeds), ref) > 1e-3
    # keeping only the BN (its inputs from the FP16 conv): the 9.79e7 variance reaches it in FP32
    bn = next(n for n in every if n.startswith("BatchNormalization"))
    part, _ = fp16.convert(model, [bn])
    node = next(n for n in part.graph.node if n.name == bn)
    inits = {t.name: t for t in part.graph.initializer}
    var = inits[_through_identity(part, node.input[4])]
    assert var.data_type == TensorProto.FLOAT and numpy_helper.to_array(var)[2] == np.float32(9.79e7)
    assert np.isfinite(_run(part, feeds)[0]).all()
    # the weight read by an FP16 MatMul and a kept one: FP16 for the first, the exact FP32 copy for the second
    mm = [n for n in every if n.startswith("MatMul")]
    part2, _ = fp16.convert(model, [mm[1]])
    by = {n.name: n for n in part2.graph.node}
    inits2 = {t.name: t for t in part2.graph.initializer}
    w16 = inits2[_through_identity(part2, by[mm[0]].input[1])]
    w32 = inits2[_through_identity(part2, by[mm[1]].input[1])]
    assert w16.data_type == TensorProto.FLOAT16 and w32.data_type == TensorProto.FLOAT
    orig = next(n for n in model.graph.node if n.output[0] == "w_fc").attribute[0].t
    assert np.array_equal(numpy_helper.to_array(w32), numpy_helper.to_array(orig))


def test_kept_path_has_no_fp16_round_trip(transformer):
    """Two kept nodes in a row and a graph input feeding a kept node: no Cast between them."""
    model = onnx.load(str(transformer))
    every = _every_node(model)
    first_two = [n.name for n in model.graph.node if n.input and n.input[0] == "x"][:1]
    m = onnx.ModelProto()
    m.CopyFrom(model)
    fp16.name_nodes(m)
    consumer = next(n.name for n in m.graph.node if n.name not in first_two and
                    any(i in {o for k in m.graph.node if k.name in first_two for o in k.output} for i in n.input))
    kept, _ = fp16.convert(model, first_two + [consumer])
    by = {n.name: n for n in kept.graph.node}
    producer = {o: n for n in kept.graph.node for o in n.output}
    for name in first_two + [consumer]:
        for i in by[name].input:
            p = producer.get(i)
            assert p is None or p.op_type != "Cast" or all(a.i != TensorProto.FLOAT16 for a in p.attribute)
    assert len(every) > 100


def _bisect(tmp: Path, model: Path, *extra: str, prelude: str = "") -> tuple[int, dict, str]:
    js = tmp / "out.json"
    code = prelude + "import sys\nfrom bisect_tui.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code, "bisect", str(model), "--session", str(tmp / "s"), "--json", str(js),
         "--bundle", str(tmp / "bundle.zip"), "--precision", "fp16", "--atol", "1e-3", "--rtol", "1e-3", "-q",
         *extra], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc.returncode, json.loads(js.read_text()), proc.stdout


def test_keepset_search_on_a_torch_transformer_is_proven(transformer, tmp_path):
    rc, res, out = _bisect(tmp_path, transformer)
    p = res["bisect"]["precision"]
    ctl = p["control"]
    assert ctl["reproduces_fp32"] and ctl["keep_all"]["passed"] and not p["instrument_failed"]
    assert ctl["keep_all"]["max_abs"] <= 2 * ctl["fp32_engine"]["max_abs"] + (ctl["rounding_floor"] or 0)
    assert p["passed"] and p["keep_fp32"] and p["metrics"]["ratio"] <= 1
    kinds = [st["kind"] for st in res["bisect"]["steps"]]
    assert "control: keep every node in FP32" in kinds and "reproduces FP32" in out
    # independently: the keep-set model passes in a plain ORT session on the session's inputs
    d = tmp_path / "x"
    zipfile.ZipFile(tmp_path / "bundle.zip").extractall(d)
    inputs = np.load(d / "keepset" / "inputs.npz")
    model = onnx.load(str(transformer))
    feeds = {"x": inputs["x"][0]}
    ref = _run(model, feeds)[0]
    got = _run(fp16.convert(model, p["keep_fp32"])[0], feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)[0]
    assert np.all(np.abs(got - ref) <= 1e-3 + 1e-3 * np.abs(ref))
    full = _run(fp16.convert(model)[0], feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)[0]
    assert not np.all(np.abs(full - ref) <= 1e-3 + 1e-3 * np.abs(ref))
    # and with the bundle's own script, which imports the shipped copy of the converter
    script = d / "keepset" / "repro_keepset.py"
    assert (d / "keepset" / "fp16_convert.py").read_text() == Path(fp16.__file__).read_text()
    assert subprocess.run([sys.executable, str(script)], capture_output=True, timeout=120, cwd=d).returncode == 1
    assert subprocess.run([sys.executable, str(script), "--keep"], capture_output=True, timeout=120,
                          cwd=d).returncode == 0


def test_a_failed_control_concludes_nothing_about_the_model(transformer, tmp_path):
    """With the old instrument (onnxruntime's converter and its node_block_list alone)
    "keep everything" stays ~FP16: the search must say its control failed."""
    prelude = ("import onnx\nfrom bisect_tui.engines.ort import fp16\n"
               "from onnxruntime.transformers.float16 import convert_float_to_float16\n"
               "def old(model, keep=()):\n"
               "    m = onnx.ModelProto(); m.CopyFrom(model); fp16.name_nodes(m)\n"
               "    return convert_float_to_float16(m, keep_io_types=True, node_block_list=sorted(keep) or None), {}\n"
               "fp16.convert = old\n")
    rc, res, out = _bisect(tmp_path, transformer, prelude=prelude)
    p = res["bisect"]["precision"]
    assert p["instrument_failed"] and not p["passed"] and not p["control"]["reproduces_fp32"]
    assert p["control"]["keep_all"]["max_abs"] > 10 * p["control"]["fp32_engine"]["max_abs"]
    assert "not the cause" not in p["explanation"] and "instrument failed its control" in p["explanation"]
    assert "instrument failed" in out and "not the cause" not in out
    assert len(p["tests"]) == 0  # no keep-set test was run on a broken instrument


def test_steps_compare_by_the_elementwise_ratio_not_the_saturated_cosine():
    """PP-OCRv4 det in FP16: the full engine read x972.8 (cosine 0.03: (1 - cos) / (1 - 0.999))
    and a keep-set step that halved the error x1000 (cosine below 0). The steps table shows the
    worst |err| / (atol + rtol*|ref|), which halves with the error."""
    from bisect_tui.core.bisect.judge import OutputJudge, elementwise_ratio
    from bisect_tui.core.report.search import step_ratio
    from bisect_tui.core.tolerance import parse_tolerance

    rng = np.random.default_rng(0)
    ref = np.abs(rng.standard_normal((1, 4096))).astype(np.float32) * 1e-4  # tiny probabilities
    judge = OutputJudge({"y": ref}, parse_tolerance("fp16"))
    noise = rng.standard_normal((1, 4096)).astype(np.float32)
    full = judge.judge([{"y": ref[0] + noise[0] * 0.2 + 0.03}])  # some correlation left
    half = judge.judge([{"y": ref[0] - np.abs(noise[0]) * 0.1}])  # half the error, anti-correlated
    assert not full.passed and not half.passed
    assert half.ratio >= full.ratio  # the verdict's worst criterion: the halving does not show
    e_full, e_half = elementwise_ratio(full), elementwise_ratio(half)
    assert e_half < 0.75 * e_full
    assert step_ratio(_step(half.passed, half.ratio, e_half)) < step_ratio(_step(full.passed, full.ratio, e_full))
    # a step that fails on the cosine alone still shows the ratio that failed it
    assert step_ratio(_step(False, 3.0, 0.5)) == 3.0


def _step(passed: bool, ratio: float, elementwise: float):
    """A step of the search as the report reads it (the record the store and the result hold)."""
    from bisect_tui.core.bisect.records import Step

    return Step(n=1, kind="keep-set test", region="whole graph", enabled=[], config={}, marks=0, passed=passed,
                ratio=ratio, max_abs=0.0, summary="", builds=1, cached=False, seconds=0.0,
                elementwise_ratio=elementwise)


def test_big_keep_sets_are_cut_then_shrunk_and_always_pass():
    """PP-OCRv4 rec at 1e-3 needs ~200 of its 440 nodes in FP32: one binary search per node
    spent the whole budget and ended with no keep-set. The search's own steps on a known
    answer (a set passes when it holds every needed node): a smallest passing prefix, chunks
    dropped while the rest passes, one-minimal once small; every set returned passed."""
    from bisect_tui.core.bisect import precision as pr

    rng = np.random.default_rng(5)
    pool = [f"n{i}" for i in range(440)]
    for needed_count, spread in ((6, 440), (30, 250)):
        needed = set(rng.choice(pool[:spread], needed_count, replace=False))
        builds = type("B", (), {"builds": 0})()
        tried = []

        def passes(keep):
            builds.builds += 1
            tried.append(set(keep))
            return needed <= set(keep)

        state = {"best": list(pool)}
        best = pr._smallest_prefix(pool, passes, state)
        assert needed <= set(best) and state["best"] == best and builds.builds <= 10
        best = pr._shrink(best, passes, builds, pr.SHRINK_BUILDS, state)
        assert needed <= set(best) and builds.builds <= 10 + pr.SHRINK_BUILDS
        assert len(best) <= pr.SMALL_SET if needed_count == 6 else len(best) < 0.8 * spread
        if len(best) <= pr.SMALL_SET:
            best = pr._one_minimal(best, passes, state)
            assert set(best) == needed  # one-minimal on a monotone answer: exactly the needed nodes
        assert needed <= set(state["best"])


def test_a_kept_if_reads_fp16_outer_values_through_a_cast():
    """A kept If (Silero VAD has them) reads outer values by name inside its branches: the
    converter leaves the branches FP32 but the value FP16 when its producer is not kept, and ORT
    refused the model ("bound to different types"). Now a Cast sits on that boundary."""
    then_g = helper.make_graph([helper.make_node("Mul", ["r", "two"], ["t_out"], name="then_mul")], "then", [],
                               [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [4])],
                               [helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])])
    else_g = helper.make_graph([helper.make_node("Add", ["r", "x"], ["e_out"], name="else_add")], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [4])])
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["r"], name="scale"),
         helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)],
        "if_model", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                     helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.full(4, 1.0001, np.float32), "w")])  # 1.0 in FP16
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    for c in (False, True):
        feeds = {"x": np.array([1.0001, -2, 3.3333, 4.1], np.float32), "c": np.array(c)}
        ref = _run(model, feeds)
        assert _max_abs(_run(fp16.convert(model, ["scale", "branch"])[0], feeds), ref) == 0.0
        only_if = _run(fp16.convert(model, ["branch"])[0], feeds)  # built: no type error
        assert 0 < _max_abs(only_if, ref) < 0.01  # the FP16 weight of the Mul, nothing else
