"""The fused-graph probe on an FP16 engine sees the tensors inside the graph, not
only the model output: ORT's CPU provider computes most FP16 ops as FP32 copies
under prefixed names, and the probe maps those back to the baseline's names.
Before, fp16_keepset.onnx showed one tensor (its output) and "first tensor out of
tolerance" was just that output."""

from __future__ import annotations

import json

import onnx

from bisect_tui.cli import main


def test_fp16_probe_sees_inner_tensors_under_baseline_names(samples, tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["check", str(samples / "fp16_keepset.onnx"), "--precision", "fp16",
                 "--session", str(tmp_path / "s"), "--json", str(out), "-q", "--no-determinism", "--no-arbiter"])
    capsys.readouterr()
    assert code == 1
    shared = json.loads(out.read_text())["shared_tensors"]
    model = onnx.load(str(samples / "fp16_keepset.onnx"))
    order = [o for n in model.graph.node for o in n.output]
    seen = [p["tensor"] for p in shared["profile"]]
    # the Relu/Add/Mul outputs ORT keeps as separate nodes (MatMul+Add became Gemm), by their
    # original names, in node order
    assert shared["tensors_compared"] == len(seen) >= 7
    assert set(seen) <= set(order) and seen == sorted(seen, key=order.index)
    assert {"blk0/relu:0", "blk2/relu:0", "side/gain:0"} <= set(seen)
    # the error starts at the Mul whose product leaves the FP16 range, not at the output
    assert shared["first_failing_tensor"] == "side/gain:0"
    ratios = {p["tensor"]: p["ratio"] for p in shared["profile"]}
    assert ratios["blk2/relu:0"] < 1 < ratios["side/gain:0"]


def test_error_profile_axes_name_the_ops_and_the_tolerance():
    """The plot of a few tensors names each op on its axis (it was a fractional axis from
    -0.4 to 0.4 under one red block); of many, integer positions; log error, tolerance at 1."""
    from bisect_tui.core.plots import ErrorProfile, _plt, profile_figure

    few = ErrorProfile(["a", "b", "c"], ["Conv", "Relu", "Mul"], [0.05, 0.2, 9.0], 2, [])
    fig = profile_figure(few)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["Conv", "Relu", "Mul"]
    assert ax.get_yscale() == "log"
    assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.get_lines())  # the tolerance line
    _plt().close(fig)
    many = ErrorProfile([f"t{i}" for i in range(300)], ["Add"] * 300, [0.5] * 299 + [3.0], 299, [])
    fig = profile_figure(many)
    ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= 299]
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks)
    _plt().close(fig)


def test_inner_tensors_out_of_tolerance_beside_a_pass_are_explained(tmp_path, capsys):
    """x*100.1 - x*100 cancels: in FP16 the difference `b` carries the rounding of two
    values near 100 (out of the fp16 tolerance), then it is scaled down and added to x,
    so the output passes. The probe, which now sees `b`, says so without contradiction."""
    import numpy as np
    from onnx import helper

    from testlib import init, make_model, vi

    nodes = [helper.make_node("Mul", ["x", "k1"], ["a"], name="big"),
             helper.make_node("Mul", ["x", "k2"], ["a2"], name="big2"),
             helper.make_node("Sub", ["a", "a2"], ["b"], name="cancel"),
             helper.make_node("Mul", ["b", "k3"], ["c"], name="shrink"),
             helper.make_node("Add", ["c", "x"], ["y"], name="out")]
    consts = [init("k1", np.array(100.1, np.float32)), init("k2", np.array(100.0, np.float32)),
              init("k3", np.array(0.01, np.float32))]
    onnx.save(make_model(nodes, [vi("x", [4, 64])], [vi("y", [4, 64])], consts), str(tmp_path / "fade.onnx"))
    code = main(["check", str(tmp_path / "fade.onnx"), "--precision", "fp16", "--session", str(tmp_path / "s"),
                 "-q", "--no-determinism", "--no-arbiter"])
    out = capsys.readouterr().out
    assert code == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("tensors inside the fused graph"))
    assert line.startswith("tensors inside the fused graph: 1 of 5 out of tolerance, first: b;")
    assert "the outputs pass" in line
