"""The pass bisection's strategy on a fake oracle: an engine of named passes
whose failure needs a known set of them (no engine library involved)."""

from __future__ import annotations

import math

from bisect_tui.core.bisect.pass_search import PassSearch, search_passes


def oracle(needed_any: list[set[str]], calls: list):
    """Fails while every pass of some set in `needed_any` is enabled."""

    def passes(disabled):
        calls.append(tuple(disabled))
        off = set(disabled)
        return not any(not (s & off) for s in needed_any)

    return passes


def names(n: int) -> list[str]:
    return [f"P{i:03d}" for i in range(n)]


def test_one_pass_among_many_within_log2_plus_3_builds():
    for n in (1, 2, 7, 64, 200):
        for k in sorted({0, n // 3, n - 1}):
            calls: list = []
            r = search_passes(oracle([{names(n)[k]}], calls), names(n), alternatives=0)
            assert r["found"] == [names(n)[k]]
            assert r["builds"] == len(set(map(frozenset, calls)))
            assert r["builds"] <= math.ceil(math.log2(max(n, 1))) + 3, (n, k, r["builds"])


def test_a_failure_needing_two_passes_names_both_as_alternatives():
    # the failure needs A and B together (DivMulFusion and CastElimination on ORT): disabling either fixes it
    cands = names(40)
    calls: list = []
    r = search_passes(oracle([{"P010", "P031"}], calls), cands)
    assert r["found"] == ["P010"]
    assert r["alternatives"] == [["P031"]]


def test_two_independent_culprits_need_both_disabled():
    cands = names(50)
    calls: list = []
    r = search_passes(oracle([{"P005"}, {"P040"}], calls), cands, alternatives=0)
    assert sorted(r["found"]) == ["P005", "P040"]
    assert r["builds"] <= 2 * (math.ceil(math.log2(50)) + 3)


def test_nothing_found_when_disabling_every_pass_still_fails():
    calls: list = []
    r = search_passes(lambda d: (calls.append(d), False)[1], names(30))
    assert r["found"] is None and r["builds"] == 1


def test_a_container_is_split_into_the_rule_inside_it():
    top = ["T0", "Rules", "T2", "T3"]
    groups = {"Rules": names(20)}

    def passes(disabled):
        off = set(disabled)
        return "Rules" in off or "P013" in off

    r = search_passes(passes, top, groups, alternatives=0)
    assert r["found"] == ["P013"]
    # every answer is a set the oracle saw passing
    assert any(t["disabled"] == ["P013"] and t["passed"] for t in r["tried"])


def test_asked_sets_are_cached():
    calls: list = []
    ps = PassSearch(oracle([{"b"}], calls))
    assert ps.ask(["a", "b"]) and ps.ask(["b", "a"])
    assert len(calls) == 1


def test_graph_diff_names_the_original_nodes_a_pass_changed(tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from bisect_tui.core.bisect.graph_diff import changed_original_nodes
    from bisect_tui.core.graph import GraphIndex

    def model(nodes, inits=()):
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                         [h.make_tensor_value_info("out", T.FLOAT, [2])], list(inits))
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])

    k = nh.from_array(np.ones(2, np.float32), "k")
    original = model([h.make_node("Relu", ["x"], ["a"], name="r"),
                      h.make_node("Gelu", ["a"], ["g"], name="act", domain="com.microsoft"),
                      h.make_node("Neg", ["k"], ["kn"], name="fold_me"),
                      h.make_node("Add", ["g", "kn"], ["out"], name="add")], [k])
    index = GraphIndex.build(original)
    # with the pass: Gelu rewritten in place (same tensors, another op), the constant branch folded
    with_pass = model([h.make_node("Relu", ["x"], ["a"], name="r"),
                       h.make_node("FastGelu", ["a"], ["g"], name="FastGelu", domain="com.microsoft"),
                       h.make_node("Add", ["g", "kn"], ["out"], name="add_renamed")],
                      [nh.from_array(-np.ones(2, np.float32), "kn")])
    onnx.save(original, tmp_path / "without.onnx")
    onnx.save(with_pass, tmp_path / "with.onnx")
    assert changed_original_nodes(tmp_path / "with.onnx", tmp_path / "without.onnx", index) == ["act", "fold_me"]
    assert changed_original_nodes(tmp_path / "without.onnx", tmp_path / "without.onnx", index) == []
    (tmp_path / "runtime.json").write_text("{}")
    assert changed_original_nodes(tmp_path / "runtime.json", tmp_path / "without.onnx", index) is None


def test_when_the_pass_bisection_runs():
    from bisect_tui.core.bisect.pass_fallback import wanted

    err = {"kind": "build_error", "message": "x"}
    assert wanted({"verdict": "no_culprit"}, [])
    assert wanted({"verdict": "not_fusion"}, [])  # FP32: an in-place rewrite marking cannot block
    assert not wanted({"verdict": "not_fusion"}, [], precision="fp16")  # the keep-set search's case
    assert wanted({"verdict": "not_fusion", "engine_error": err}, [], precision="fp16")
    assert not wanted({"verdict": "no_culprit"}, [], amplifies=True)  # amplified rounding is not switched off
    assert not wanted({"verdict": "no_culprit", "local_judgement": {}}, [])
    assert wanted({"verdict": "no_culprit", "engine_error": err}, [], amplifies=True)
    assert not wanted({"verdict": "culprits"}, [])
    assert not wanted({"verdict": "no_culprit"}, ["a culprit"])
