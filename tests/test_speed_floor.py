"""bench/speed_floor.py's premises on the real engine: the five whole-graph builds it
counts as the answer's floor are the configurations the answer needs. If ONNX Runtime
stops fusing the keepdims=0 LayerNorm (or starts fusing it right), the floor no
longer describes the answer and this fails, instead of the bench quietly printing a
bound for the wrong builds."""

from __future__ import annotations

import sys

import numpy as np
import onnx

from testlib import REPO

sys.path.insert(0, str(REPO / "bench"))
import speed_floor  # noqa: E402
from scale_models import two_culprit_stack  # noqa: E402


def test_the_floor_measures_the_builds_the_answer_needs(tmp_path):
    model, expected = two_culprit_stack(10, 6)
    path = tmp_path / "ln0_150.onnx"
    onnx.save(model, str(path))
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.random.default_rng(0).standard_normal((1, 16, 16)).astype(np.float32))

    specs = speed_floor.pieces(path, inputs, expected)
    outs, cpu = {}, {}
    for k, (label, spec) in enumerate(specs):
        spec["save"] = str(tmp_path / f"out_{k}.npy")
        got = speed_floor.measure(spec)
        assert got["piece"] >= 0 and got["imports"] > 0
        cpu[label] = got["piece"]
        if spec["kind"] == "ort":
            outs[label] = np.load(spec["save"])
    labels = list(outs)
    unfused = outs[labels[0]]  # the dump
    ok = {lab: speed_floor.judge(o, unfused)[0] for lab, o in outs.items()}
    assert [ok[lab] for lab in labels] == [True, True, False, False, True, True, True], ok
    assert labels[2].startswith("1 user's engine") and labels[3].startswith("2 LayerNormFusionL1")
    by_label = dict(specs)
    # the held culprits are marked tensors: 9 nodes of culprit 1, 6 of culprit 2
    assert len(by_label["3 culprit 1 held, the rest fused"]["marks"]) == 9
    assert len(by_label["5 L1 disabled, culprit 2 held"]["marks"]) == 6
    assert by_label["4 both passes disabled (workaround)"]["disabled"] == ["LayerNormFusionL1",
                                                                         "SimplifiedLayerNormFusion"]
    assert set(cpu) == set(by_label)


def test_the_cheaper_proofs_cut_where_one_tensor_carries_the_graph(tmp_path):
    """The cheaper proofs the bench bounds: every cut is a real separator (the parts,
    built one by one, give the whole-graph build's output bit for bit here, since no
    fusion of this stack crosses a block's residual) and the downstream rest proofs
    start at the last cut before culprit 1, with its nodes still inside."""
    model, expected = two_culprit_stack(10, 6)
    path = tmp_path / "ln0_150.onnx"
    onnx.save(model, str(path))
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.random.default_rng(0).standard_normal((1, 16, 16)).astype(np.float32))

    from bisect_tui.core.bisect.parts import separators
    from bisect_tui.core.graph import GraphIndex

    seps = separators(GraphIndex.build(model))
    assert seps and all(t.endswith("/res:0") or t.startswith("blk") for _, t in seps)
    at = {n.name: i for i, n in enumerate(model.graph.node)}
    rows = speed_floor.cheaper(path, inputs, expected, 4)
    assert [stands for *_, stands in rows] == ["2", "3", "4", "5", "3", "5"]
    whole = dict(speed_floor.pieces(path, inputs, expected))
    by_stand = {"2": "2 LayerNormFusionL1 disabled", "3": "3 culprit 1 held, the rest fused",
                "4": "4 both passes disabled (workaround)", "5": "5 L1 disabled, culprit 2 held"}
    dump = whole["baseline dump (unfused, every tensor marked)"]
    dump["save"] = str(tmp_path / "dump.npy")
    speed_floor.measure(dump)
    unfused = np.load(dump["save"])
    for k, (label, spec, stands) in enumerate(rows):
        spec["save"] = str(tmp_path / f"cheap_{k}.npy")
        speed_floor.measure(spec)
        out = np.load(spec["save"])
        w = whole[by_stand[stands]]
        w["save"] = str(tmp_path / f"whole_{stands}.npy")
        speed_floor.measure(w)
        assert speed_floor.judge(out, unfused)[0] == (stands != "2"), label
        if "start" in spec:
            start = [i for i, t in seps if t == spec["start"]][0]
            assert start < min(at[n] for n in expected[0])
            assert not [i for i, t in seps if start < i < min(at[n] for n in expected[0])]
        else:
            assert len(spec["cuts"]) == 3
            assert np.array_equal(out, np.load(w["save"])), label
