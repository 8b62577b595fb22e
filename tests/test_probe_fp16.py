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
