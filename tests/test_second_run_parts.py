"""The determinism check's second run made as the graph's parts (core/parted_run.py):
the same digests as one session, cuts refused where they would not carry the graph,
the real child process reporting its parts, and a mismatch settled by a second run
in one session. Real ONNX Runtime on a 300-node stack, the part size lowered."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisect_tui.core.bisect import parts
from bisect_tui.core.checks import check_determinism
from bisect_tui.core.graph import GraphIndex
from bisect_tui.core.groups import run_groups
from bisect_tui.core.inputs import InputSet
from bisect_tui.core.parted_run import _split, plan_cuts_for, run_in_parts
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.core.report.sections import determinism_line
from bisect_tui.core.second_run import HashSink
from bisect_tui.core.triage.records import DeterminismResult
from bisect_tui.engines.ort.unfused import OrtUnfused


@pytest.fixture
def stack(ln_stack_300):
    return ln_stack_300


def _inputs(samples=2):
    rng = np.random.default_rng(3)
    return InputSet({"x": rng.standard_normal([samples, 1, 16, 16]).astype(np.float32)}, {})


def test_parts_give_one_sessions_digests_for_every_tensor(stack):
    model, _ = stack
    index = GraphIndex.build(model)
    tensors = index.intermediate_tensors()
    cuts = parts.plan_cuts(index, part_nodes=60)
    assert len(cuts) >= 3
    inputs = _inputs()
    whole, cut = HashSink(), HashSink(keep=True)
    run_groups(OrtUnfused(), model, [tensors], inputs, whole)
    assert run_in_parts(OrtUnfused(), model, cuts, tensors, inputs, cut) == len(cuts) + 1
    assert len(whole.digests) == len(tensors) and cut.digests == whole.digests
    assert cut.value(tensors[-1], 1) is not None  # the float64 truth's check still has the values


def test_cuts_that_do_not_carry_the_graph_are_refused(stack, monkeypatch):
    model, _ = stack
    monkeypatch.setattr(parts, "PART_NODES", 60)
    index = GraphIndex.build(model)
    cuts = parts.plan_cuts(index, part_nodes=60)
    assert _split(model, cuts) is not None
    assert _split(model, tuple(reversed(cuts))) is None  # out of the node order
    # a tensor that is not a separator: a node below reads another tensor from above it
    seps = {t for _, t in parts.separators(index)}
    inner = next(o for n in index.nodes[70:] for o in n.output if o and o not in seps)
    assert _split(model, (inner,)) is None
    # a subgraph reads tensors from outside itself: such a model is run in one session
    sub = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "then", [],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.node.append(helper.make_node("If", ["c"], ["z"], then_branch=sub, else_branch=sub))
    assert _split(m, cuts) is None

    def triage(reference, external=False):
        info = type("Info", (), {"external": external, "model": model, "index": index})()
        return type("T", (), {"info": info, "reference": reference})()

    assert plan_cuts_for(triage(OrtUnfused())) == parts.plan_cuts(index) != ()
    assert plan_cuts_for(triage(type("Plain", (), {})())) == ()  # a reference that does not say so
    assert plan_cuts_for(triage(OrtUnfused(), external=True)) == ()
    monkeypatch.setattr(parts, "PART_NODES", 160)
    assert plan_cuts_for(triage(OrtUnfused())) == ()  # under two parts' worth of nodes


def test_the_second_run_in_parts_proves_itself_on_the_dump(stack, tmp_path, monkeypatch):
    _, path = stack
    monkeypatch.setattr(parts, "PART_NODES", 60)
    t = Triage(TriageOptions(model=path, session_dir=tmp_path / "s"), lambda p: None)
    t.run_all()
    det = t.session.read_json("determinism.json")
    assert det["deterministic"] is True and det["tensors_compared"] == 300
    assert det["second_run"]["parts"] >= 3 and "bit-identical" in det["second_run"]["control"]
    line = determinism_line(DeterminismResult.from_json(det))
    assert line.endswith(f"(the second in {det['second_run']['parts']} parts)")
    monkeypatch.setattr(parts, "PART_NODES", 640)
    t2 = Triage(TriageOptions(model=path, session_dir=tmp_path / "s2"), lambda p: None)
    t2.run_all()
    assert "second_run" not in t2.session.read_json("determinism.json")  # too small to cut: one session


def test_a_mismatch_in_parts_is_settled_by_one_session(stack, tmp_path):
    _, path = stack
    t = Triage(TriageOptions(model=path, session_dir=tmp_path / "m"), lambda p: None)
    t.run_baseline()
    manifest = t.baseline.manifest
    tensors = [e["tensor"] for e in manifest["tensors"]]

    class PartedRun:  # what a second run in parts would say were a part's bits not the session's
        groups = [tensors]
        parts = 5

        def collect(self, progress=None):
            got = {e["tensor"]: e["sha256"] for e in manifest["tensors"]}
            got[tensors[7]] = "0" * 64
            return got

        def abort(self):
            pass

    t.session.path("determinism.json").unlink(missing_ok=True)
    res = check_determinism(t.info, t.session, t.inputs, t.shapes, manifest, t.max_memory, started=PartedRun(),
                            reference=t.reference)
    assert res["deterministic"] is True and res["differing"] == []  # one session agrees with the dump
    assert res["second_run"] == {"parts": 5, "parts_differed": tensors[7]}
    assert "parts" not in determinism_line(DeterminismResult.from_json(res))


def test_a_second_run_started_late_is_cut_too(stack, tmp_path, monkeypatch):
    """Where the second run could not start beside the dump (a large model, several
    groups) the determinism step starts it, with the same cuts."""
    from bisect_tui.core.parted_run import plan_cuts_for

    _, path = stack
    monkeypatch.setattr(parts, "PART_NODES", 60)
    t = Triage(TriageOptions(model=path, session_dir=tmp_path / "late"), lambda p: None)
    monkeypatch.setattr(Triage, "_start_second_run_early", lambda self: None)
    t.run_baseline()
    res = t.run_determinism()
    assert res["deterministic"] is True and res["overlapped"] is False
    assert res["second_run"]["parts"] == len(plan_cuts_for(t)) + 1 >= 3
