"""drop_unfed_inputs: the inputs an IR-3 optimized graph keeps of its folded
initializers go; an input that is fed, read by a node (or a subgraph) or is an
output stays. Every input fed returns at once (it is called for every group the
probe observes) with the same answer as the full walk."""

import onnx
from onnx import TensorProto, helper

from bisect_tui.core.legacy_models import drop_unfed_inputs


def _model(extra_inputs, nodes=None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    ins = [x] + [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in extra_inputs]
    nodes = nodes or [helper.make_node("Relu", ["x"], ["y"], name="r")]
    return helper.make_model(helper.make_graph(nodes, "g", ins, [y]), opset_imports=[helper.make_opsetid("", 17)])


def test_every_input_fed_keeps_the_graph():
    m = _model(["w"], [helper.make_node("Add", ["x", "w"], ["y"], name="a")])
    before = m.SerializeToString()
    assert drop_unfed_inputs(m, {"x", "w"}) == []
    assert m.SerializeToString() == before


def test_folded_initializer_inputs_go_and_read_ones_stay():
    then = helper.make_graph([helper.make_node("Identity", ["s"], ["t_out"], name="i")], "then", [],
                             [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="a"),
             helper.make_node("If", ["c"], ["z"], name="if", then_branch=then, else_branch=then)]
    m = _model(["w", "folded", "s", "c"], nodes)
    assert drop_unfed_inputs(m, {"x"}) == ["folded"]
    assert [vi.name for vi in m.graph.input] == ["x", "w", "s", "c"]  # w, c read by nodes, s by a subgraph
    onnx.checker.check_model(m)
