"""The "all fusions blocked" build made as the graph's parts (core/bisect/parts.py),
on the real ONNX Runtime: the same outputs bit for bit as the whole graph, graph
inputs fed to every part that reads them, cuts only where one tensor carries the
graph, only for builds marking every tensor on an engine that says so, the whole
graph when a part fails, and the same answer from a bisection that uses it."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisect_tui.api import EngineBuildError, EngineConfig
from bisect_tui.core.bisect import parts
from bisect_tui.core.bisect.pool import BuildJob, build_and_run
from bisect_tui.core.bisect.run import run_bisection
from bisect_tui.core.bisect.units import Unit
from bisect_tui.core.graph import GraphIndex
from bisect_tui.core.model import InputSpec
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.engines.ort.engine import OrtEngine

from testlib import REPO

sys.path.insert(0, str(REPO / "bench"))
from scale_models import two_culprit_stack  # noqa: E402


def _every_tensor(model) -> tuple[str, ...]:
    return tuple(GraphIndex.build(model).intermediate_tensors())


def _separates(index: GraphIndex, cut: str) -> bool:
    """Nothing below the cut reads a tensor made above it but the cut itself."""
    at = index.order[index.producer[cut]]
    for n in index.nodes[at + 1:]:
        for t in index.inputs[n.name]:
            p = index.producer.get(t)
            if p is not None and index.order[p] <= at and t != cut:
                return False
    return True


def _runs(model, path, feeds, cuts, engine=None):
    engine = engine or OrtEngine()
    marks = _every_tensor(model)
    outs = [o.name for o in model.graph.output]
    job = BuildJob(config=EngineConfig(), marks=marks, outputs=tuple(outs), cuts=tuple(cuts))
    return build_and_run(engine, str(path), feeds, job, "main", outs)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    d = tmp_path_factory.mktemp("parts")
    model, expected = two_culprit_stack(20, 12)  # 300 nodes
    path = d / "ln0_300.onnx"
    onnx.save(model, str(path))
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal([1, 16, 16]).astype(np.float32)} for _ in range(2)]
    return model, path, feeds, expected


def test_parts_give_the_whole_graphs_outputs_bit_for_bit(stack):
    model, path, feeds, _ = stack
    index = GraphIndex.build(model)
    cuts = parts.plan_cuts(index, part_nodes=60)
    assert 3 <= len(cuts) <= 5, cuts
    assert all(_separates(index, c) for c in cuts)
    whole = _runs(model, path, feeds, ())
    parted = _runs(model, path, feeds, cuts)
    assert whole.parts == 0 and parted.parts == len(cuts) + 1
    assert parted.error_kind is None and len(parted.outputs) == 2
    for w, p in zip(whole.outputs, parted.outputs):
        assert list(w) == list(p)
        for k in w:
            assert np.array_equal(w[k], p[k]), k
    # every tensor is marked: the output is the unfused graph's
    unfused = OrtEngine().build(path, EngineConfig(level="disable"))
    try:
        assert np.array_equal(unfused.run(feeds[0])[model.graph.output[0].name], parted.outputs[0]["blk19/res:0"])
    finally:
        unfused.close()


def test_graph_inputs_reach_every_part_that_reads_them(tmp_path):
    """A scale fed to every block (as an attention mask is): no cut is lost to it."""
    nodes, inits, h = [], [], "x"
    for i in range(30):
        inits.append(helper.make_tensor(f"b{i}", TensorProto.FLOAT, [4], np.full(4, 0.1 * i, np.float32)))
        nodes += [helper.make_node("Mul", [h, "s"], [f"m{i}"], name=f"mul{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Tanh", [f"a{i}"], [f"t{i}"], name=f"tanh{i}")]
        h = f"t{i}"
    g = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                            helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info(h, TensorProto.FLOAT, [2, 4])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "scaled.onnx"
    onnx.save(model, str(path))
    cuts = parts.plan_cuts(GraphIndex.build(model), part_nodes=20)
    assert len(cuts) >= 3
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal([2, 4]).astype(np.float32),
              "s": rng.uniform(0.5, 1.5, 4).astype(np.float32)}]
    whole, parted = _runs(model, path, feeds, ()), _runs(model, path, feeds, cuts)
    assert parted.parts == len(cuts) + 1
    assert np.array_equal(whole.outputs[0][h], parted.outputs[0][h])


def test_no_cuts_for_small_graphs_or_graphs_without_separators():
    model, _ = two_culprit_stack(20, 12)
    assert parts.plan_cuts(GraphIndex.build(model)) == ()  # 300 nodes: under two parts' worth
    # two chains from one tensor, joined only at the end: no single tensor carries the
    # graph (chains from a graph input would be cut: the inputs are fed to every part)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="r")]
    for c in "ab":
        prev = "r"
        for i in range(40):
            nodes.append(helper.make_node("Relu", [prev], [f"{c}{i}"], name=f"{c}{i}"))
            prev = f"{c}{i}"
    nodes.append(helper.make_node("Add", ["a39", "b39"], ["y"], name="join"))
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    assert parts.plan_cuts(GraphIndex.build(helper.make_model(g)), part_nodes=10) == ()


def test_cuts_only_when_every_tensor_is_marked_on_an_engine_that_says_so(stack, monkeypatch):
    model, *_ = stack
    monkeypatch.setattr(parts, "PART_NODES", 60)
    index = GraphIndex.build(model)
    every = _every_tensor(model)
    triage = SimpleNamespace(engine=OrtEngine(), info=SimpleNamespace(index=index, external=[],
                                                                     inputs=[InputSpec("x", "float32", [1, 16, 16])]))
    assert parts.cuts_for(triage, EngineConfig(), every) == parts.plan_cuts(index, 60) != ()
    assert parts.cuts_for(triage, EngineConfig(precision="fp16"), every) == ()  # converted as a whole
    # a marked build (some fusions left): only at marked separators no fused node spans
    cuts = parts.plan_cuts(index, 60)
    assert parts.cuts_for(triage, EngineConfig(), every[1:]) == ()  # no map of the engine: whole
    some = tuple(t for t in every if t != cuts[1])
    got = parts.cuts_for(triage, EngineConfig(), some, units=[])
    assert got and cuts[1] not in got and set(got) <= set(t for _, t in parts.separators(index))
    # a fusion that keeps the cut tensor as one of its own outputs (as a SkipLayerNorm keeps
    # the residual sum) spans it: never cut there, marked or not
    producer = index.producer[cuts[0]]
    consumer = index.consumers[cuts[0]][0]
    span = Unit(0, "skip", "SkipLayerNormalization", [producer, consumer], ["X"], [cuts[0]])
    assert cuts[0] in parts.cuts_for(triage, EngineConfig(), every[1:], units=[])
    assert cuts[0] not in parts.cuts_for(triage, EngineConfig(), every[1:], units=[span])
    triage.info.external = [{"location": "w.bin"}]
    assert parts.cuts_for(triage, EngineConfig(), every) == ()
    # a symbolic batch: a part fed one batch size could be optimized for it alone
    triage.info.external = []
    assert parts.cuts_for(triage, EngineConfig(), every) != ()
    triage.info.inputs = [InputSpec("x", "float32", ["batch", 16, 16])]
    assert parts.cuts_for(triage, EngineConfig(), every) == ()


class _FailsOnPart(OrtEngine):
    """The real engine, refusing the second part (as an engine might a fragment)."""

    def build(self, model_path, config, marked=(), workdir=None, *, context=None):
        if str(model_path).endswith("part_1.onnx"):
            raise EngineBuildError("no", "refused part_1")
        return super().build(model_path, config, marked, workdir, context=context)


def test_a_part_the_engine_fails_on_gives_way_to_the_whole_graph(stack):
    model, path, feeds, _ = stack
    cuts = parts.plan_cuts(GraphIndex.build(model), part_nodes=60)
    res = _runs(model, path, feeds, cuts, engine=_FailsOnPart())
    whole = _runs(model, path, feeds, ())
    assert res.parts == 0 and res.error_kind is None
    assert np.array_equal(res.outputs[0]["blk19/res:0"], whole.outputs[0]["blk19/res:0"])


def _bisect(stack, tmp_path, name):
    _, path, feeds, _ = stack
    np.savez(tmp_path / "x.npz", x=feeds[0]["x"])
    t = Triage(TriageOptions(model=path, session_dir=tmp_path / name, config=EngineConfig(),
                             input_file=tmp_path / "x.npz"))
    t.run_all()
    assert t.fused["passed"] is False
    return run_bisection(t)


def test_a_bisection_with_the_blocked_build_in_parts_gives_the_same_answer(stack, tmp_path, monkeypatch):
    whole = _bisect(stack, tmp_path, "whole")
    monkeypatch.setattr(parts, "PART_NODES", 60)
    parted = _bisect(stack, tmp_path, "parted")
    blocked = [s for s in parted["steps"] if s["kind"] == "all fusions blocked" and not s["cached"]]
    assert len(blocked) == 1 and blocked[0]["parts"] >= 4 and blocked[0]["passed"]
    assert blocked[0]["region"] == f"whole graph, in {blocked[0]['parts']} parts"
    # both rounds' rest proofs (marked builds, the round's map known) in parts too; the
    # unmarked builds (the attribution's, the workaround's) whole
    rest = [s for s in parted["steps"] if s["kind"].endswith("remaining fusions") and not s["cached"]]
    assert len(rest) == 2 and all(s["parts"] >= 2 and s["passed"] for s in rest), rest
    assert all(not s.get("parts") for s in parted["steps"] if not s["marks"])
    assert not any(s.get("parts") for s in whole["steps"])
    _, _, _, expected = stack
    for res in (whole, parted):
        assert [sorted(c["original_nodes"]) for c in res["culprits"]] == [sorted(e) for e in expected]
    assert [c["exposed_by"] for c in whole["culprits"]] == [c["exposed_by"] for c in parted["culprits"]]
    assert whole["workaround"]["disabled_optimizers"] == parted["workaround"]["disabled_optimizers"]
    # no other step changes: kinds, verdicts and ratios in the same order
    def row(s):
        return (s["kind"], s["passed"], round(s["ratio"], 6))
    assert [row(s) for s in whole["steps"]] == [row(s) for s in parted["steps"]]
