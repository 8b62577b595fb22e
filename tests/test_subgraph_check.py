"""A suspect judged on its own subgraph (core/bisect/subgraph_check.py) stands
for the whole-graph build only where it gives the same answer: checked here
against the real whole-graph build on sample models, plus the cases where it
must refuse (a different fusion in isolation) and the model-output edge case."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import helper

from bisect_tui.core.bisect.run import run_bisection
from bisect_tui.core.bisect.search import Bisector, Candidate
from bisect_tui.core.bisect.isolate import value_types
from bisect_tui.core.bisect.subgraph_check import downstream_model, suspect_on_subgraph
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.api import EngineConfig

from testlib import culprit_matches, gelu_triage, init, make_model, vi

GELU = EngineConfig(config_entries=(("optimization.enable_gelu_approximation", "1"),))


@pytest.mark.parametrize("case", ["transformer_block", "deep_stack", "branchy"])
def test_subgraph_verdict_equals_the_whole_graph_build(samples, cases, tmp_path, case):
    t = gelu_triage(samples / f"{case}.onnx", tmp_path / "s")
    bis = Bisector(t)
    units, _ = bis.units_at(t.opts.config.level)
    expected = cases[case]["expected_culprits"][0]
    culprit = next(u for u in units if culprit_matches(u.original_nodes, expected))
    innocent = next(u for u in units if u.blockable and u is not culprit and u.op_type != "FastGelu")
    for u in (culprit, innocent):
        sub = suspect_on_subgraph(bis, u, bis.config, tmp_path / f"sub_{u.index}")
        assert sub is not None, f"{u.op_type} should fuse the same way in isolation"
        whole = bis.evaluate_many([Candidate("suspect alone", [u], held=[])])[0]
        j = sub["judgement"]
        assert j.passed == whole.passed
        assert j.ratio == pytest.approx(whole.ratio, rel=1e-3, abs=1e-6)
    assert not bis.evaluate_many([Candidate("suspect alone", [culprit], held=[])])[0].passed


def test_bisection_confirms_the_suspect_on_its_subgraph(samples, cases, tmp_path):
    t = gelu_triage(samples / "transformer_block.onnx", tmp_path / "s")
    res = run_bisection(t)
    assert res["verdict"] == "culprits"
    assert culprit_matches(res["culprits"][0]["original_nodes"], cases["transformer_block"]["expected_culprits"][0])
    sub = [s for s in res["steps"] if s.get("subgraph")]
    assert [s["kind"] for s in sub] == ["suspect alone, on its subgraph"] and not sub[0]["passed"]
    assert res["subgraph_builds"] == 1
    # no whole-graph build for the suspect, no level-by-level builds, and no "remaining
    # fusions": the attribution's build (the pass disabled) keeps every other fused node
    whole = [s["kind"] for s in res["steps"] if not s["cached"] and not s.get("subgraph")]
    assert whole == ["all fusions blocked", "disable GeluApproximation"]
    assert res["engine_builds"] == 2
    proof = next(s for s in res["steps"] if s["n"] == res["rest_proven_by"]["step"])
    assert proof["kind"] == "disable GeluApproximation" and proof["passed"]
    assert res["workaround"]["disabled_optimizers"] == ["GeluApproximation"]
    # resumed: the subgraph step is read back, nothing is built
    again = run_bisection(Triage(TriageOptions(model=samples / "transformer_block.onnx",
                                               session_dir=tmp_path / "s", config=GELU), lambda p: None))
    assert again["engine_builds"] == 0 and again["subgraph_builds"] == 0
    assert [s["kind"] for s in again["steps"]] == [s["kind"] for s in res["steps"]]


def test_a_different_fusion_in_isolation_falls_back_to_the_whole_graph(samples, cases, tmp_path):
    t = gelu_triage(samples / "transformer_block.onnx", tmp_path / "s")
    bis = Bisector(t)
    units, _ = bis.units_at(t.opts.config.level)
    culprit = next(u for u in units if u.op_type == "FastGelu")
    # the same nodes, claimed to make another op: the subgraph's fusion differs, so it cannot stand in
    other = dataclasses.replace(culprit, op_type="Gelu")
    assert suspect_on_subgraph(bis, other, bis.config, tmp_path / "other") is None
    # fewer nodes than the engine fuses: also not the same fusion
    part = dataclasses.replace(culprit, original_nodes=culprit.original_nodes[:-1])
    assert suspect_on_subgraph(bis, part, bis.config, tmp_path / "part") is None


def test_suspect_producing_a_model_output(tmp_path):
    """The suspect's output is the model's output: the rest of the graph has
    nothing to run, and the judged value is the suspect's own."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Div", ["h", "sqrt2"], ["d"], name="g/div"),
             helper.make_node("Erf", ["d"], ["e"], name="g/erf"),
             helper.make_node("Add", ["e", "one"], ["a"], name="g/add"),
             helper.make_node("Mul", ["h", "a"], ["m"], name="g/mulx"),
             helper.make_node("Mul", ["m", "half"], ["y"], name="g/half")]
    rng = np.random.default_rng(0)
    model = make_model(nodes, [vi("x", [4, 64])], [vi("y", [4, 64])],
                       [init("w", (rng.standard_normal((64, 64)) * 0.5).astype(np.float32)),
                        init("sqrt2", np.float32(np.sqrt(2))), init("one", np.float32(1)),
                        init("half", np.float32(0.5))])
    path = tmp_path / "out_gelu.onnx"
    onnx.save(model, path)
    np.savez(tmp_path / "x.npz", x=(rng.standard_normal((4, 64)) * 3).astype(np.float32))
    t = Triage(TriageOptions(model=path, session_dir=tmp_path / "s", config=GELU,
                             input_file=tmp_path / "x.npz"), lambda p: None)
    t.run_all()
    bis = Bisector(t)
    units, _ = bis.units_at(t.opts.config.level)
    gelu = next(u for u in units if u.op_type == "FastGelu")
    down = downstream_model(t.info.model, gelu, value_types(t))
    assert "y" in {i.name for i in down.graph.input} and not any(n.name.startswith("g/") for n in down.graph.node)
    sub = suspect_on_subgraph(bis, gelu, bis.config, tmp_path / "sub")
    assert sub is not None
    whole = bis.evaluate_many([Candidate("suspect alone", [gelu], held=[])])[0]
    assert sub["judgement"].passed == whole.passed
    assert sub["judgement"].ratio == pytest.approx(whole.ratio, rel=1e-3, abs=1e-6)


def test_level_search_is_kept_when_the_suspect_is_a_layout_node(samples, cases, tmp_path):
    """A suspect in one of the engine's coarse (layout) domains stands for a whole
    trunk: the search then goes down to the lowest failing level as before.
    Here the FastGelu's own domain is declared coarse to show the rule on a
    real ORT run; without it the search stays at the user's level."""
    from bisect_tui.engines.ort.engine import OrtEngine

    plain = run_bisection(gelu_triage(samples / "transformer_block.onnx", tmp_path / "plain"))
    assert plain["level"] == "all" and not any(s["kind"].startswith("level ") for s in plain["steps"])
    eng = OrtEngine()
    eng.capabilities = dataclasses.replace(eng.capabilities, coarse_domains=("com.microsoft",))
    t = Triage(TriageOptions(model=samples / "transformer_block.onnx", session_dir=tmp_path / "coarse",
                             config=GELU), lambda p: None, engine=eng)
    t.run_all()
    res = run_bisection(t)
    assert [s["kind"] for s in res["steps"] if s["kind"].startswith("level ")] == ["level basic", "level extended"]
    assert res["level"] == "extended"
    assert [c["original_nodes"] for c in res["culprits"]] == [c["original_nodes"] for c in plain["culprits"]]


@pytest.mark.slow
def test_fanout_builds_blocked_and_the_attribution_in_one_round(samples, tmp_path):
    """With the suspect confirmed on its subgraph, --fanout 2 asks for "all fusions
    blocked" and the suspect's attribution build (its pass found on the subgraph) in
    one round: two workers build them at once, with the same steps, verdicts and
    build count as one worker."""
    runs = {}
    for workers in (1, 2):
        t = gelu_triage(samples / "transformer_block.onnx", tmp_path / f"w{workers}")
        runs[workers] = run_bisection(t, workers=workers, fanout=2)
    one, two = runs[1], runs[2]
    kinds = [s["kind"] for s in one["steps"]]
    assert kinds == ["full engine", "suspect alone, on its subgraph", "all fusions blocked",
                     "disable GeluApproximation"]
    assert [(s["kind"], s["passed"], s["ratio"]) for s in two["steps"]] == \
        [(s["kind"], s["passed"], s["ratio"]) for s in one["steps"]]
    assert one["engine_builds"] == two["engine_builds"] == 2
    rounds = {s["kind"]: s for s in two["steps"]}
    assert rounds["all fusions blocked"]["round_size"] == rounds["disable GeluApproximation"]["round_size"] == 2
    assert {rounds["all fusions blocked"]["worker"], rounds["disable GeluApproximation"]["worker"]} != {"main"}


def test_the_attribution_build_stands_for_the_rest_only_when_it_keeps_every_other_fusion(samples, cases, tmp_path):
    """two_culprits: both Gelu blocks are FastGelu by the same pass. Disabling it
    after the first culprit also removes the second, so that build proves nothing
    about the other fusions: "remaining fusions" is built, fails, and the second
    culprit is found. With both held, the same build holds every other fused node
    and stands for the last "remaining fusions"."""
    t = gelu_triage(samples / "two_culprits.onnx", tmp_path / "s")
    res = run_bisection(t)
    expected = cases["two_culprits"]["expected_culprits"]
    assert len(res["culprits"]) == 2
    assert all(any(culprit_matches(c["original_nodes"], e) for c in res["culprits"]) for e in expected)
    rest = [s for s in res["steps"] if s["kind"] == "remaining fusions"]
    assert len(rest) == 1 and not rest[0]["passed"]
    proof = next(s for s in res["steps"] if s["n"] == res["rest_proven_by"]["step"])
    assert proof["kind"] == "disable GeluApproximation" and proof["passed"]
    assert proof["n"] < rest[0]["n"]  # built for the first culprit, read again for the second


def test_blocked_build_made_during_the_subgraph_check_changes_nothing(samples, tmp_path, monkeypatch):
    """"all fusions blocked" is built in a thread while the suspect is judged on its
    subgraph (Bisector.prefetch): the steps, verdicts, ratios and build count are
    those of the search without it."""
    import threading

    from bisect_tui.engines.ort.engine import OrtEngine

    where = {}
    real = OrtEngine.build

    def build(self, model_path, config, marked=(), workdir=None, *, context=None):
        if len(marked) > 10:  # the blocked build marks every tensor
            where["blocked"] = threading.current_thread().name
        return real(self, model_path, config, marked, workdir, context=context)

    monkeypatch.setattr(OrtEngine, "build", build)
    with_pf = run_bisection(gelu_triage(samples / "transformer_block.onnx", tmp_path / "pf"))
    assert where["blocked"].startswith("prefetch-build")
    monkeypatch.setattr(Bisector, "prefetch", lambda self, cand: None)
    plain = run_bisection(gelu_triage(samples / "transformer_block.onnx", tmp_path / "plain"))
    assert where["blocked"] == threading.main_thread().name
    shape = lambda r: [(s["kind"], s["passed"], s["ratio"], s["builds"], s["cached"]) for s in r["steps"]]  # noqa: E731
    assert shape(with_pf) == shape(plain) and with_pf["engine_builds"] == plain["engine_builds"] == 2


def test_attribution_build_starts_before_the_suspect_is_judged_and_changes_nothing(samples, tmp_path,
                                                                                   monkeypatch):
    """With the probe's suspect named, its pass is found on its subgraph and the full
    engine with that pass disabled is built in a thread from then on (beside the
    subgraph check and the blocked build); the attribution and the rest proof take
    that build. Steps, verdicts, ratios, the build count and the culprit's pass are
    those of the search without it."""
    import threading
    import time

    import bisect_tui.core.bisect.subgraph_check as sc
    from bisect_tui.engines.ort.engine import OrtEngine

    seen: dict = {}
    real_build, real_check = OrtEngine.build, sc.suspect_on_subgraph

    def build(self, model_path, config, marked=(), workdir=None, *, context=None):
        if config.disabled_passes and not marked and workdir is not None:  # a full-engine rebuild
            seen.setdefault("attribution", (threading.current_thread().name, time.perf_counter()))
        return real_build(self, model_path, config, marked, workdir, context=context)

    def check(*a, **k):
        try:
            return real_check(*a, **k)
        finally:
            seen.setdefault("judged", time.perf_counter())

    monkeypatch.setattr(OrtEngine, "build", build)
    monkeypatch.setattr(sc, "suspect_on_subgraph", check)
    early = run_bisection(gelu_triage(samples / "transformer_block.onnx", tmp_path / "early"))
    thread, started = seen["attribution"]
    assert thread.startswith("prefetch-build") and started < seen["judged"]
    seen.clear()
    monkeypatch.setattr(Bisector, "_prefetch_attribution", lambda self, u: None)
    plain = run_bisection(gelu_triage(samples / "transformer_block.onnx", tmp_path / "plain"))
    assert seen["attribution"][0] == threading.main_thread().name and seen["attribution"][1] > seen["judged"]
    shape = lambda r: [(s["kind"], s["passed"], s["ratio"], s["builds"], s["cached"]) for s in r["steps"]]  # noqa: E731
    assert shape(early) == shape(plain) and early["engine_builds"] == plain["engine_builds"] == 2
    assert [c["attribution"]["confirmed"] for c in early["culprits"]] == [["GeluApproximation"]]
    assert ([c["attribution"]["confirmed"] for c in early["culprits"]]
            == [c["attribution"]["confirmed"] for c in plain["culprits"]])
    assert early.get("rest_proven_by") and early["rest_proven_by"] == plain["rest_proven_by"]


@pytest.mark.parametrize("case", ["deep_stack", "branchy"])
def test_downstream_run_equals_running_every_other_node(samples, cases, tmp_path, case):
    """The subgraph check runs only the nodes downstream of the suspect, upstream
    tensors fed from the baseline: bit for bit what running every other node of the
    model gives, and the outputs it leaves out are the baseline's exactly."""
    from bisect_tui.core.baseline_store import load_tensor, reference_output
    from bisect_tui.core.reference import UnfusedModel

    t = gelu_triage(samples / f"{case}.onnx", tmp_path / "s")
    bis = Bisector(t)
    units, _ = bis.units_at(t.opts.config.level)
    u = next(x for x in units if culprit_matches(x.original_nodes, cases[case]["expected_culprits"][0]))
    types = value_types(t)
    down = downstream_model(t.info.model, u, types, t.info.index.order)
    others = [n for n in t.info.model.graph.node if n.name not in set(u.original_nodes)]
    assert 0 < len(down.graph.node) < len(others)
    # only the weights its nodes read (ORT took each unused one out again at session creation)
    weights = {w.name for w in t.info.model.graph.initializer}
    read = {i for n in down.graph.node for i in n.input}
    assert {w.name for w in down.graph.initializer} == read & weights < weights
    every = onnx.ModelProto()
    every.CopyFrom(t.info.model)
    del every.graph.node[:]
    every.graph.node.extend(others)
    for o in u.outputs:
        dtype, shape = types[o]
        every.graph.input.append(helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                                               shape))
    base = {n: np.asarray(load_tensor(t.session, t.baseline.manifest, n)) for n in
            [i.name for i in down.graph.input] if n not in t.inputs.arrays}
    moved = {o: base[o][0] * np.float32(1.001) for o in u.outputs}  # the suspect's values, changed
    feeds = {**t.inputs.feeds(0), **moved}
    upstream = {n: a[0] for n, a in base.items() if n not in moved}
    outs = list(t.info.outputs)
    new = UnfusedModel(t.reference, down).run({**feeds, **upstream}, [o.name for o in down.graph.output])
    old = UnfusedModel(t.reference, every).run(feeds, outs)
    assert new and set(new) <= set(outs)
    for name in outs:
        if name in new:
            np.testing.assert_array_equal(new[name], old[name])
        else:
            np.testing.assert_array_equal(old[name], reference_output(t.info, t.session, t.baseline.manifest,
                                                                       t.inputs, name)[0])
