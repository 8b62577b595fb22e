"""The bisection on sample models with known answers (sample_models/cases.json,
itself verified against ORT by test_samples.py)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from bisect_tui.cli import main
from bisect_tui.core.bisect.run import run_bisection
from bisect_tui.core.cancel import CancelToken
from bisect_tui.core.errors import Cancelled
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.core.tolerance import parse_tolerance
from bisect_tui.api import EngineConfig

from testlib import REPO, culprit_matches, init, make_model, old_ort_skip, vi

GELU = (("optimization.enable_gelu_approximation", "1"),)


def triage_for(model, tmp_path, name="s", config=EngineConfig(config_entries=GELU), progress=None,
               cancel=None, **kw):
    opts = TriageOptions(model=model, session_dir=tmp_path / name, config=config, **kw)
    t = Triage(opts, progress or (lambda p: None), cancel)
    t.run_all()
    return t


def full_engine_passes(model, inputs, disabled, tol_atol=1e-4, tol_rtol=1e-4, precision="fp32"):
    """Independent check of a workaround with plain ORT: full engine vs ORT_DISABLE_ALL."""
    def run(level, extra):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        for k, v in extra:
            so.add_session_config_entry(k, v)
        s = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"],
                                 disabled_optimizers=list(disabled))
        return s.run(None, inputs)
    ref = run(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ())
    got = run(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, GELU)
    return all(np.all(np.abs(g - r) <= tol_atol + tol_rtol * np.abs(r)) for g, r in zip(got, ref))


@pytest.mark.parametrize("case", ["transformer_block", "deep_stack", "branchy"])
def test_single_culprit_is_exactly_the_broken_pattern(samples, cases, tmp_path, case):
    t = triage_for(samples / f"{case}.onnx", tmp_path)
    assert t.fused["passed"] is False
    res = run_bisection(t)
    assert res["verdict"] == "culprits"
    assert len(res["culprits"]) == len(cases[case]["expected_culprits"]) == 1
    assert culprit_matches(res["culprits"][0]["original_nodes"], cases[case]["expected_culprits"][0])
    c = res["culprits"][0]
    assert c["op_type"] == cases[case]["culprit_op_type"] == "FastGelu"
    assert "GeluApproximation" in c["optimizers"]
    assert c["attribution"]["confirmed"]  # proven by a rebuild, not read from a name
    iso = next(iter(c["isolated"]["outputs"].values()))
    assert iso["breaks_tolerance"] and iso["fused_worse"]
    assert iso["error_ratio"] > 100  # the approximation is far further from float64 than FP32 is
    assert 1e-4 < iso["fused_vs_truth"]["max_abs"] < 1e-3
    assert c["worst_elements"][0]["fused_err"] == pytest.approx(iso["fused_vs_truth"]["max_abs"], rel=1e-6)
    w = res["workaround"]
    assert w["kind"] == "disable_optimizers" and w["full_engine"]["passed"]
    x = dict(np.load(t.session.inputs_path))
    assert full_engine_passes(samples / f"{case}.onnx", {k: v[0] for k, v in x.items()},
                              w["disabled_optimizers"])
    assert not full_engine_passes(samples / f"{case}.onnx", {k: v[0] for k, v in x.items()}, [])
    # few builds: the search, not a scan of every fused node
    search_steps = [s for s in res["steps"] if s["kind"] != "workaround" and not s["kind"].startswith("disable")]
    assert len(search_steps) <= 4 + int(np.ceil(np.log2(len(res["units"])))) + 2


def test_two_independent_culprits_are_both_found(samples, cases, tmp_path):
    res = run_bisection(triage_for(samples / "two_culprits.onnx", tmp_path))
    assert res["verdict"] == "culprits"
    found = sorted(c["original_nodes"] for c in res["culprits"])
    expected = sorted(cases["two_culprits"]["expected_culprits"])
    assert len(found) == 2 and all(culprit_matches(f, e) for f, e in zip(found, expected))
    assert not any(c["interaction"] for c in res["culprits"])
    assert res["workaround"]["full_engine"]["passed"]


def test_passing_model_yields_no_culprit(samples, tmp_path):
    res = run_bisection(triage_for(samples / "passing_stack.onnx", tmp_path))
    assert res["verdict"] == "pass" and res["culprits"] == [] and res["workaround"] is None
    assert res["engine_builds"] == 0  # the full engine check built is reused
    assert [s["kind"] for s in res["steps"]] == ["full engine"] and res["steps"][0]["passed"]


@old_ort_skip
def test_fp16_layernorm_culprit(samples, cases, tmp_path):
    case = cases["layernorm_fp16"]
    t = triage_for(samples / "layernorm_fp16.onnx", tmp_path, config=EngineConfig(precision="fp16"),
                   tolerance=parse_tolerance("fp16"))
    res = run_bisection(t)
    assert [c["original_nodes"] for c in res["culprits"]] == case["expected_culprits"]
    assert res["culprits"][0]["op_type"] == "LayerNormalization"
    assert res["workaround"]["full_engine"]["passed"]
    assert any(n.startswith("LayerNormFusion") for n in res["workaround"]["disabled_optimizers"])


def _pair_model(tmp_path):
    """Two Gelu patterns on equal inputs summed: each alone is within the
    tolerance used below, both together are not (their errors add up)."""
    def gelu(p, x):
        return [helper.make_node("Div", [x, f"{p}/sqrt2"], [f"{p}/div"], name=f"{p}/div"),
                helper.make_node("Erf", [f"{p}/div"], [f"{p}/erf"], name=f"{p}/erf"),
                helper.make_node("Add", [f"{p}/erf", f"{p}/one"], [f"{p}/add"], name=f"{p}/add"),
                helper.make_node("Mul", [x, f"{p}/add"], [f"{p}/mulx"], name=f"{p}/mulx"),
                helper.make_node("Mul", [f"{p}/mulx", f"{p}/half"], [f"{p}/out"], name=f"{p}/half")]

    def consts(p):
        return [init(f"{p}/sqrt2", np.float32(np.sqrt(2))), init(f"{p}/one", np.float32(1)),
                init(f"{p}/half", np.float32(0.5))]
    nodes = gelu("ga", "x") + gelu("gb", "x2") + [helper.make_node("Add", ["ga/out", "gb/out"], ["y"], name="sum")]
    m = make_model(nodes, [vi("x", [4, 64]), vi("x2", [4, 64])], [vi("y", [4, 64])], consts("ga") + consts("gb"))
    onnx.save(m, tmp_path / "pair.onnx")
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    np.savez(tmp_path / "pair_in.npz", x=x, x2=x)
    return tmp_path / "pair.onnx", tmp_path / "pair_in.npz"


def test_interaction_is_reported_as_a_set(tmp_path):
    model, inputs = _pair_model(tmp_path)
    t = triage_for(model, tmp_path, input_file=inputs, tolerance=parse_tolerance("fp32", atol=6e-4, rtol=0))
    res = run_bisection(t)
    assert len(res["culprits"]) == 1
    c = res["culprits"][0]
    assert c["interaction"] is True
    assert c["original_nodes"] == [f"{p}/{n}" for p in ("ga", "gb") for n in ("div", "erf", "add", "mulx", "half")]
    alone = [s for s in res["steps"] if len(s["enabled"]) == 1]
    assert alone and all(s["passed"] for s in alone)  # neither fusion fails on its own


def test_not_a_fusion_is_said_not_blamed(tmp_path):
    """FP16 rounding of weights, judged at FP32 tolerance: the error stays with
    every fusion blocked, so no fusion may be blamed."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("Add", ["a", "b1"], ["h"], name="bias1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    p = tmp_path / "fp16.onnx"
    onnx.save(make_model(nodes, [vi("x", [4, 32])], [vi("y", [4, 32])],
                         [init("w1", rng.standard_normal((32, 32)).astype(np.float32)),
                          init("b1", rng.standard_normal(32).astype(np.float32)),
                          init("w2", rng.standard_normal((32, 32)).astype(np.float32))]), p)
    t = triage_for(p, tmp_path, config=EngineConfig(precision="fp16"), tolerance=parse_tolerance("fp32"))
    assert t.fused["passed"] is False
    res = run_bisection(t)
    assert res["verdict"] == "not_fusion" and res["culprits"] == []
    assert res["all_blocked"]["passed"] is False
    assert "does not come from a fusion" in res["explanation"]
    assert res["workaround"] is None


def test_cancel_then_resume_reuses_steps(samples, cases, tmp_path):
    token = CancelToken()
    seen = []

    def progress(p):
        if p.stage == "bisect" and "step" in p.data:
            seen.append(p.data["step"]["n"])
            if len(seen) == 3:
                token.cancel()

    t = triage_for(samples / "deep_stack.onnx", tmp_path, progress=progress, cancel=token)
    with pytest.raises(Cancelled):
        run_bisection(t)
    lines = (t.session.bisect_dir / "steps.jsonl").read_text().splitlines()
    assert len(lines) == 3
    t2 = triage_for(samples / "deep_stack.onnx", tmp_path)
    res = run_bisection(t2)
    assert res["reused_steps"] >= 3
    assert culprit_matches(res["culprits"][0]["original_nodes"], cases["deep_stack"]["expected_culprits"][0])
    first_three = [s for s in res["steps"][:3]]
    assert all(s["cached"] for s in first_three)


def test_cli_bisect_bundle_repro_exit_codes(samples, tmp_path, capsys):
    model = samples / "transformer_block.onnx"
    code = main(["bisect", str(model), "--session", str(tmp_path / "s"), "--ort-config",
                 "optimization.enable_gelu_approximation=1", "--json", str(tmp_path / "r.json"),
                 "--report", str(tmp_path / "r.md"), "--bundle", str(tmp_path / "b.zip"), "-q"])
    out = capsys.readouterr().out
    assert code == 1
    assert "culprit 1: FastGelu" in out and "workaround: disable GeluApproximation" in out
    md = (tmp_path / "r.md").read_text()
    for section in ("## Environment", "### Culprits", "### Steps", "### Workaround", "### How to reproduce"):
        assert section in md
    with zipfile.ZipFile(tmp_path / "b.zip") as z:
        names = set(z.namelist())
        assert {"repro/repro.py", "repro/subgraph.onnx", "repro/inputs.npz", "repro/expected.npz"} <= names
        z.extractall(tmp_path / "bundle")
    sub = onnx.load(tmp_path / "bundle" / "repro" / "subgraph.onnx")
    assert culprit_matches([n.name for n in sub.graph.node], ["mlp/gelu/div", "mlp/gelu/erf", "mlp/gelu/add_one",
                                                             "mlp/gelu/mul_x", "mlp/gelu/mul_half"])
    repro = tmp_path / "bundle" / "repro" / "repro.py"
    bad = subprocess.run([sys.executable, str(repro)], capture_output=True, text=True)
    assert bad.returncode == 1 and "bug present" in bad.stdout
    ok = subprocess.run([sys.executable, str(repro), "--disable", "GeluApproximation"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "within tolerance" in ok.stdout


def test_cli_bisect_on_passing_model_exits_0(samples, tmp_path, capsys):
    code = main(["bisect", str(samples / "cnn.onnx"), "--session", str(tmp_path / "s"), "-q"])
    assert code == 0
    assert "nothing to find" in capsys.readouterr().out


def test_resume_survives_deleted_engine_files(samples, tmp_path):
    import shutil

    t = triage_for(samples / "transformer_block.onnx", tmp_path)
    first = run_bisection(t)
    shutil.rmtree(t.session.engines_dir)  # e.g. a user freeing disk space
    t2 = triage_for(samples / "transformer_block.onnx", tmp_path)
    again = run_bisection(t2)
    assert [c["original_nodes"] for c in again["culprits"]] == [c["original_nodes"] for c in first["culprits"]]
    assert again["reused_steps"] > 0 and again["probe_agrees"] is True


def test_amplifying_model_is_flagged_not_blamed(tmp_path):
    """A 40-block stack amplifies FP32 rounding: default fusions alone break the
    FP32 tolerance. The sensitivity check says so before the search, and the
    local judgement (each fused node alone vs float64) blames none of them."""
    sys.path.insert(0, str(REPO / "sample_models"))
    import build

    g, _ = build._stack("amp", 7, 40, set())
    onnx.save(g.model("amplifying stack"), tmp_path / "amp.onnx")
    t = triage_for(tmp_path / "amp.onnx", tmp_path, config=EngineConfig())
    assert t.fused["passed"] is False
    sens = t.fused["sensitivity"]
    assert sens["amplifies"] is True and sens["ratio"] > 1
    res = run_bisection(t, max_culprits=2)
    # judged alone against float64, no default fusion is worse than FP32: nothing is blamed
    lj = res["local_judgement"]
    assert res["verdict"] == "no_culprit" and res["culprits"] == []
    assert lj["worse"] == [] and len(lj["reorders_only"]) == len(lj["units"]) > 40
    assert max(r["ratio"] for r in lj["units"]) < lj["factor"]
    assert "amplifies rounding" in res["explanation"]


def test_well_conditioned_model_is_not_flagged(samples, tmp_path):
    t = triage_for(samples / "transformer_block.onnx", tmp_path)
    sens = t.fused["sensitivity"]
    assert sens["amplifies"] is False and sens["ratio"] < 0.5
    res = run_bisection(t)
    assert res["culprits"][0]["amplified"] is False and "stopped" not in res
