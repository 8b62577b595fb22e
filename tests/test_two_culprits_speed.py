"""Two culprits, one behind the other (ONNX Runtime issue 30513, bench/scale_models.py):
a LayerNorm whose ReduceMeans keep no dims is fused by LayerNormFusionL1 and, once
that pass is off, by SimplifiedLayerNormFusion just as wrongly. The search must name
both with as few whole-graph builds as the plan allows (each distinct configuration
built once for the whole search, the candidate passes tested on the culprit's
subgraph) and give the same answer as the search that builds the whole graph for
every candidate pass and each round's own blocked build."""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import Optional

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from bisect_tui.core.bisect import findings as findings_mod
from bisect_tui.core.bisect.run import run_bisection
from bisect_tui.core.bisect.trials import Trials
from bisect_tui.core.model import load_model_info
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.api import EngineConfig

from testlib import REPO

sys.path.insert(0, str(REPO / "bench"))
from scale_models import two_culprit_stack  # noqa: E402

L1, SIMPLIFIED = "LayerNormFusionL1", "SimplifiedLayerNormFusion"
HOLD_S = 30.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """10 blocks (150 nodes), the keepdims=0 LayerNorm in block 6, and its input."""
    d = tmp_path_factory.mktemp("ln0")
    model, expected = two_culprit_stack(10, 6)
    path = d / "ln0_150.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(0).standard_normal([1, 16, 16]).astype(np.float32)
    np.savez(d / "x.npz", x=x)
    return path, d / "x.npz", expected, x


def bisect(stack, tmp_path, name):
    path, inputs, _, _ = stack
    t = Triage(TriageOptions(model=path, session_dir=tmp_path / name, config=EngineConfig(), input_file=inputs))
    t.run_all()
    assert t.fused["passed"] is False
    return run_bisection(t)


def answer(res: dict) -> dict:
    """What a user reads: the culprits, what exposed them, their passes and evidence, the workaround."""
    culprits = [{k: c[k] for k in ("kind", "layer", "exposed_by", "fused_node", "op_type", "original_nodes",
                                   "optimizers", "amplified", "units", "worst_elements")}
                | {"confirmed": c["attribution"]["confirmed"],
                   "float64": {o: (v.get("fused_worse"), v.get("vs_truth")) for o, v in c["isolated"]["outputs"].items()}}
                for c in res["culprits"]]
    w = res["workaround"]
    return {"verdict": res["verdict"], "culprits": culprits, "layers": res["layers"],
            "workaround": {k: w.get(k) for k in ("kind", "disabled_optimizers", "full_engine", "how")}}


def whole_graph_builds(res: dict) -> list[dict]:
    return [s for s in res["steps"] if not s["cached"] and not s.get("subgraph")]


def _whole_graph_threads(monkeypatch, model_name: str, timed: Optional[list] = None,
                         hold: Optional[tuple[tuple, tuple]] = None) -> list[tuple[str, tuple, int]]:
    """(thread, disabled passes, marks) of every build of the session's whole model;
    `timed` gets (disabled passes, marks, start, end, the thread's nice value) of each.
    `hold` (A, B): the unmarked build with passes A off, once built, waits (at most
    HOLD_S) until the unmarked build with passes B off has started. On a 150-node
    model a build takes milliseconds, so whether B starts while A is in flight would
    otherwise be a race; held, B starts inside A's span only if it was launched
    without waiting for A's result, and after the wait times out if it was not."""
    from bisect_tui.engines.ort.engine import OrtEngine

    seen: list[tuple[str, tuple, int]] = []
    real = OrtEngine.build
    b_started = threading.Event()

    def build(self, model_path, config, marked=(), workdir=None, *, context=None):
        if not str(model_path).endswith(model_name):
            return real(self, model_path, config, marked, workdir, context=context)
        off = tuple(config.disabled_passes)
        seen.append((threading.current_thread().name, off, len(marked)))
        t0 = time.perf_counter()
        if hold is not None and off == hold[1] and not marked:
            b_started.set()
        try:
            got = real(self, model_path, config, marked, workdir, context=context)
            if hold is not None and off == hold[0] and not marked:
                b_started.wait(HOLD_S)
            return got
        finally:
            if timed is not None:
                nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if hasattr(os, "getpriority") else 0
                timed.append((tuple(config.disabled_passes), len(marked), t0, time.perf_counter(), nice))

    monkeypatch.setattr(OrtEngine, "build", build)
    return seen


def test_both_culprits_both_passes_with_few_whole_graph_builds(stack, tmp_path, monkeypatch):
    path, _, expected, x = stack
    timed: list = []
    seen = _whole_graph_threads(monkeypatch, "model.onnx", timed, hold=((L1,), (L1, SIMPLIFIED)))
    from bisect_tui.core.bisect.search import Bisector

    checked: list = []  # (passes disabled, end) of each suspect's check on its subgraph
    real_check = Bisector.check_on_subgraph

    def check_on_subgraph(self, u):
        try:
            return real_check(self, u)
        finally:
            checked.append((tuple(self.config.disabled_passes), time.perf_counter()))

    monkeypatch.setattr(Bisector, "check_on_subgraph", check_on_subgraph)
    res = bisect(stack, tmp_path, "fast")
    assert res["verdict"] == "culprits"
    first, second = res["culprits"]
    assert (first["op_type"], first["original_nodes"], first["exposed_by"]) == ("LayerNormalization", expected[0], None)
    assert (second["op_type"], second["original_nodes"], second["exposed_by"]) == (
        "SimplifiedLayerNormalization", expected[1], [L1])
    assert first["attribution"]["confirmed"] == [L1] and second["attribution"]["confirmed"] == [SIMPLIFIED]
    # each further from float64 than the unfused FP32 ops
    assert all(o["fused_worse"] for c in (first, second) for o in c["isolated"]["outputs"].values())
    w = res["workaround"]
    assert w["kind"] == "disable_optimizers" and w["disabled_optimizers"] == [L1, SIMPLIFIED]
    assert w["full_engine"]["passed"] is True
    # the workaround, checked with plain ORT
    so = ort.SessionOptions()
    ref = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"],
                               disabled_optimizers=[L1, SIMPLIFIED]).run(None, {"x": x})[0]
    so0 = ort.SessionOptions()
    so0.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    unfused = ort.InferenceSession(str(path), so0, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.allclose(ref, unfused, atol=1e-4, rtol=1e-4)

    built = whole_graph_builds(res)
    assert len(built) == res["engine_builds"]
    fused = len(res["units"])
    bound = math.ceil(math.log2(fused)) + 3
    assert res["engine_builds"] + 1 <= 2 * bound  # + the check's full engine; two culprits
    keys = [s["key"] for s in built]
    assert len(keys) == len(set(keys)), "a configuration built twice"
    configs = [(tuple(s["config"].get("disabled_optimizers") or ()), s["marks"]) for s in built]
    assert len(configs) == len(set(configs))
    # the passes the subgraph rejects (LayerNormFusion, LayerNormFusionL2) got no whole-graph build
    assert not [s for s in res["steps"] if s["kind"] in ("disable LayerNormFusion", "disable LayerNormFusionL2")]
    rows = {r["optimizer"]: r for r in first["attribution"]["candidates"]}
    assert rows[L1]["tested_on"] == "whole graph" and rows[L1]["culprit_gone_when_disabled"] is True
    assert rows["LayerNormFusionL2"]["tested_on"] == "subgraph"
    assert rows["LayerNormFusionL2"]["culprit_gone_when_disabled"] is False
    # round 2 adopted round 1's blocked build: shown, reused, not built
    blocked = [s for s in res["steps"] if s["kind"].endswith("all fusions blocked")]
    assert len(blocked) == 2 and [s["cached"] for s in blocked] == [False, True]
    # every build of the whole graph is a step (or the check's): no prefetch went unused
    assert len(seen) == res["engine_builds"] + 1
    # each round's "remaining fusions" (culprit held, the others free: neither no mark nor
    # every tensor marked) was built beside its attribution's build, not after it: disabling
    # LayerNormFusionL1 on culprit 1's subgraph lets SimplifiedLayerNormFusion fuse its nodes
    n_all = len(load_model_info(path).index.intermediate_tensors())
    remaining = [(thread, off) for thread, off, marks in seen if 0 < marks < n_all]
    assert [off for _, off in remaining] == [(), (L1,)]
    assert all(thread.startswith("prefetch-build") for thread, _ in remaining), remaining
    # round 2's attribution (both passes off), guessed on culprit 1's subgraph, was built
    # beside round 1's (LayerNormFusionL1 off), not after it (round 1's build held open
    # until it started: `hold`), at a lower priority, and taken
    unmarked = {off: (start, end, nice) for off, marks, start, end, nice in timed if marks == 0}
    both, first_off = unmarked[(L1, SIMPLIFIED)], unmarked[(L1,)]
    assert both[0] < first_off[1], (both, first_off)
    assert [thread for thread, off, marks in seen if off == (L1, SIMPLIFIED) and not marks][0].startswith("prefetch-build")
    if hasattr(os, "getpriority"):
        assert both[2] > os.getpriority(os.PRIO_PROCESS, 0) == first_off[2]
    # round 2's remaining fusions (SimplifiedLayerNormalization held), the build round 2 ends
    # on, was started before that suspect's check on its subgraph had ended, not once the
    # suspect was confirmed, and at the search's own priority
    rest2 = [(start, nice) for off, marks, start, end, nice in timed if off == (L1,) and 0 < marks < n_all]
    round2_check = [end for off, end in checked if off == (L1,)]
    assert len(rest2) == 1 and round2_check and rest2[0][0] < round2_check[0], (rest2, checked)
    if hasattr(os, "getpriority"):
        assert rest2[0][1] == os.getpriority(os.PRIO_PROCESS, 0)


def test_same_answer_as_whole_graph_attribution_and_a_blocked_build_per_round(stack, tmp_path, monkeypatch):
    fast = bisect(stack, tmp_path, "fast")
    # the search before: every candidate pass on a whole-graph build, each round its own blocked build
    monkeypatch.setattr(findings_mod, "attribute_on_subgraph", lambda *a, **k: None)
    monkeypatch.setattr(findings_mod, "pass_tests", lambda *a, **k: None)
    monkeypatch.setattr(Trials, "adopt_blocked", lambda self, step: None)
    slow = bisect(stack, tmp_path, "slow")
    assert answer(fast) == answer(slow)
    assert fast["engine_builds"] < slow["engine_builds"]
    # SimplifiedLayerNormFusion alone: read off culprit 1's subgraph (LayerNormFusionL1 still fuses
    # it there) in the fast search, built in the slow one, and failing in both
    alone = {run: [t for t in r["workaround"]["tried"] if t["disabled_optimizers"] == [SIMPLIFIED]][0]
             for run, r in (("fast", fast), ("slow", slow))}
    assert alone["fast"]["built"] is False and alone["fast"]["tested_on"] == "subgraph"
    assert alone["fast"]["culprit_kept"] == fast["culprits"][0]["fused_node"] and alone["fast"]["passed"] is False
    assert "built" not in alone["slow"] and alone["slow"]["passed"] is False and alone["slow"]["ratio"] > 1
    assert not [s for s in whole_graph_builds(fast) if s["config"].get("disabled_optimizers") == [SIMPLIFIED]]
    assert [s for s in whole_graph_builds(slow) if s["config"].get("disabled_optimizers") == [SIMPLIFIED]]
    assert {s["kind"] for s in whole_graph_builds(slow)} >= {"disable LayerNormFusion", "disable LayerNormFusionL2"}
