"""The strategy alone: proposed trials, scripted verdicts, no engine.

The search is handed a store (in memory), a scheduler (the real one, over a
pool that hands back a fixed fused-node map instead of building) and a judge
that fails a trial exactly when a scripted set of fusions is active in it.
What it must learn from pass/fail alone: a culprit that fails by itself, an
interaction of two that only fail together, in as few trials as a binary
search allows; and a rerun over the same records replays it without a build.
"""

from __future__ import annotations

import math

import pytest
from onnx import TensorProto, helper

from bisect_tui.core.bisect.judge import Judgement
from bisect_tui.core.bisect.pool import BuildResult
from bisect_tui.core.bisect.scheduler import BuildScheduler
from bisect_tui.core.bisect.store import MemoryStore
from bisect_tui.core.bisect.strategy import Search
from bisect_tui.core.graph import GraphIndex
from bisect_tui.api import Capabilities, EngineConfig, FusedNode

N = 12  # fused patterns in a chain, each two original nodes with one interior tensor
CAPS = Capabilities(marking=True, marking_blocks=True, pass_switches=False, keep_high_precision=False)


def chain(tmp_path):
    """x0 -> [a_i -> m_i -> b_i] -> x_{i+1} ... -> x_N; pattern i fuses a_i and b_i."""
    nodes, fused = [], []
    for i in range(N):
        nodes += [helper.make_node("Relu", [f"x{i}"], [f"m{i}"], name=f"a{i}"),
                  helper.make_node("Neg", [f"m{i}"], [f"x{i + 1}"], name=f"b{i}")]
        fused.append(FusedNode(f"F{i}", "Fused", "", [f"x{i}"], [f"x{i + 1}"], [f"a{i}", f"b{i}"], [f"Pass{i}"]))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info(f"x{N}", TensorProto.FLOAT, [1])])
    optimized = tmp_path / "optimized.onnx"
    optimized.write_bytes(b"stands for the engine's optimized graph")
    return GraphIndex.build(helper.make_model(g)), fused, optimized


class MapPool:
    """A pool that builds nothing: an unmarked job gets the fixed fused-node map."""

    kind = "serial"
    workers = 1

    def __init__(self, fused, optimized):
        self.fused, self.optimized, self.jobs = fused, str(optimized), []

    def run(self, jobs):
        self.jobs += jobs
        return [BuildResult(outputs=[], fused_nodes=None if j.marks else [f.to_dict() for f in self.fused],
                            fused_objs=None if j.marks else list(self.fused),
                            optimized=None if j.marks else self.optimized) for j in jobs]


class ScriptedJudge:
    """Fails a trial when every fusion of one failing set is active (none of its
    interior tensors marked, its pass not disabled)."""

    def __init__(self, failing: list[set[int]]):
        self.failing = failing
        self.asked = 0

    def judge_trial(self, plan, result) -> Judgement:
        self.asked += 1
        marked = set(plan.marks)
        off = set(plan.config.disabled_passes)
        active = {i for i in range(N) if f"m{i}" not in marked and f"Pass{i}" not in off}
        fails = any(s <= active for s in self.failing)
        ratio = 7.0 if fails else 0.25
        return Judgement(not fails, ratio, "out", ratio * 1e-4, "out: scripted" if fails else "PASS", {})


def search(tmp_path, failing, store=None, fanout=1):
    index, fused, optimized = chain(tmp_path)
    pool = MapPool(fused, optimized)
    scheduler = BuildScheduler(pool, outputs=(f"x{N}",), engine_dir=lambda cfg: tmp_path / "engine", fanout=fanout)
    (tmp_path / "engine").mkdir(exist_ok=True)
    judge = ScriptedJudge(failing)
    s = Search(store or MemoryStore(), scheduler, judge, caps=CAPS, fanout=fanout,
               config=EngineConfig(), index=index, search_key="scripted")
    return s, pool, judge


def test_a_culprit_and_an_interaction_from_pass_fail_alone(tmp_path):
    s, pool, judge = search(tmp_path, [{7}, {2, 9}])
    res = s.run()
    assert res["verdict"] == "culprits"
    assert res["culprits"] == [[7], [2, 9]]  # the single culprit first (the shorter failing prefix)
    assert [u["fused_node"] for u in res["units"]] == [f"F{i}" for i in range(N)]
    kinds = [st["kind"] for st in res["steps"]]
    assert kinds[:2] == ["full engine", "all fusions blocked"] and "interaction" in kinds
    # every trial judged once, every build counted once, nothing rebuilt within the run
    assert s.builds == len(pool.jobs) == judge.asked == len({st["key"] for st in res["steps"]})
    # a binary search, not one trial per fused node: about log2(12) per culprit and partner
    bisect_steps = kinds.count("bisect")
    assert bisect_steps <= 3 * math.ceil(math.log2(N)) < N * 2
    assert res["steps"][-1]["kind"] == "remaining fusions" and res["steps"][-1]["passed"]
    # the whole trial sequence, as the search has always made it (17 trials)
    assert [(st["kind"], st["passed"]) for st in res["steps"]] == [
        ("full engine", False), ("all fusions blocked", True), ("all fusions at level", False),
        ("bisect", True), ("bisect", False), ("bisect", False), ("bisect", True), ("culprit alone", False),
        ("remaining fusions", False), ("bisect", False), ("bisect", True), ("culprit alone", True),
        ("bisect", False), ("bisect", True), ("bisect", False), ("interaction", False),
        ("remaining fusions", True)]


def test_a_rerun_over_the_same_records_replays_without_a_build(tmp_path):
    first, _, _ = search(tmp_path, [{7}, {2, 9}])
    a = first.run()
    again, pool, judge = search(tmp_path, [{7}, {2, 9}], store=MemoryStore(first.store.records.values()))
    b = again.run()
    assert pool.jobs == [] and judge.asked == 0 and again.builds == 0
    assert b["culprits"] == a["culprits"]
    assert [(st["kind"], st["passed"], st["key"]) for st in b["steps"]] == \
        [(st["kind"], st["passed"], st["key"]) for st in a["steps"]]
    assert all(st["cached"] for st in b["steps"])


@pytest.mark.parametrize("failing, verdict", [([], "pass"), ([set()], "not_fusion")])
def test_nothing_to_find_and_not_a_fusion(tmp_path, failing, verdict):
    """Passing: one trial. Failing with every fusion blocked: the error is not a fusion's."""
    s, pool, _ = search(tmp_path, failing)
    res = s.run()
    assert res["verdict"] == verdict and res["culprits"] == []
    assert len(pool.jobs) == (1 if verdict == "pass" else 2)
    if verdict == "not_fusion":
        assert "every fusion blocked" in res["explanation"] and "FP32" in res["explanation"]


def test_more_split_points_a_round_find_the_same_culprits(tmp_path):
    one, _, _ = search(tmp_path / "k1", [{7}, {2, 9}])
    three, pool, _ = search(tmp_path / "k3", [{7}, {2, 9}], fanout=3)
    a, b = one.run(), three.run()
    assert b["culprits"] == a["culprits"] == [[7], [2, 9]]
    assert any(st.get("round_size") == 3 for st in b["steps"])  # rounds of three builds


def test_the_build_budget_stops_the_search_cleanly(tmp_path):
    s, pool, _ = search(tmp_path, [{7}, {2, 9}])
    s.max_builds = 5
    res = s.run()
    assert res["stopped"] == "max_builds" and len(pool.jobs) == 5
    assert res["stopped_reason"].startswith("stopped after 5 engine builds (--max-builds)")


@pytest.fixture(autouse=True)
def _dirs(tmp_path):
    for sub in ("k1", "k3"):
        (tmp_path / sub).mkdir()
