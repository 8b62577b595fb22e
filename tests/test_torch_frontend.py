"""The PyTorch front end with real torch: export, forward-hook golden data,
the export cross-check and its coverage, and the golden-data pitfalls.

Every model is one of sample_models/torch_models.py (seeded weights, built in
code). Each pitfall model carries its pitfall for real; the tests assert on
the numbers, names and files the real exporter, hooks and ORT produce."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bisect_tui.cli import main  # noqa: E402
from bisect_tui.core.errors import UserError  # noqa: E402
from bisect_tui.core.pipeline import Triage, TriageOptions  # noqa: E402
from bisect_tui.core.reference import Reference, UnfusedModel  # noqa: E402
from bisect_tui.engines.ort.unfused import OrtUnfused  # noqa: E402
from bisect_tui.frontends.torch import TorchSpec, looks_like_spec  # noqa: E402
from bisect_tui.frontends.torch.pitfalls import batch_permutation, softmax_side  # noqa: E402
from testlib import REPO  # noqa: E402

MODELS = REPO / "sample_models" / "torch_models.py"


def spec(factory: str, exporter: str = "auto") -> dict:
    return TorchSpec.parse(f"{MODELS}:{factory}", exporter).to_dict()


def triage(tmp: Path, factory: str, exporter: str = "auto", **kw) -> Triage:
    t = Triage(TriageOptions(model=None, session_dir=tmp / factory, torch=spec(factory, exporter),
                             max_memory=4 << 30, **kw))
    t.run_all()
    return t


def pitfall(t: Triage, kind: str) -> dict:
    return next(p for p in t.framework["pitfalls"] if p["kind"] == kind)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Triage:
    return triage(tmp_path_factory.mktemp("tiny"), "tiny_transformer")


def test_tiny_transformer_exported_with_dynamo_into_the_session(tiny):
    rec = json.loads((tiny.session.root / "torch" / "export.json").read_text())
    assert rec["exporter"] == "dynamo" and rec["fallback_reason"] is None
    assert rec["torch_version"] == torch.__version__
    exported = Path(rec["path"])
    assert exported.parent == (tiny.session.root / "torch").resolve() or exported.parent == tiny.session.root / "torch"
    assert hashlib.sha256(exported.read_bytes()).hexdigest() == rec["onnx_sha256"]
    assert tiny.info.node_count > 50 and tiny.info.outputs  # the session's model is that export
    assert tiny.summary()["verdict"] == "pass"


def test_hooks_save_every_module_like_the_baseline(tiny):
    gdir = tiny.session.root / "torch" / "golden"
    man = json.loads((gdir / "manifest.json").read_text())
    names = [e["name"] for e in man["entries"]]
    modules = [p for p, _ in tiny._torch.loaded.module.named_modules()]
    assert len(names) == len(modules) == 28  # every module, the root included, once
    # children finish before their parents: the execution order the index records
    assert names[:3] == ["layer_0000_blocks.0.ln1", "layer_0001_blocks.0.attn.q", "layer_0002_blocks.0.attn.k"]
    assert names[-1] == "layer_0027_model"
    assert man["deterministic"] is True and man["precision"] == "fp32" and man["mode"] == "eval"
    ex = tiny._torch.loaded.example_inputs
    with torch.no_grad():
        out = tiny._torch.loaded.module(*ex).numpy()
    for e in man["entries"]:
        data = (gdir / e["file"]).read_bytes()
        arr = np.load(gdir / e["file"], allow_pickle=False)
        assert arr.shape == (1, *e["shape"])
        assert hashlib.sha256(arr.tobytes()).hexdigest() == e["sha256"]
        assert len(data) > e["bytes"]  # header + data
    np.testing.assert_array_equal(np.load(gdir / "layer_0027_model.npy")[0], out)


def test_crosscheck_maps_by_metadata_and_reports_coverage(tiny):
    cc = tiny.framework["crosscheck"]
    cov = cc["coverage"]
    assert cc["passed"] and tiny.framework["export_matches"]
    assert cov["modules"] == 28 and cov["outputs"] == 28
    # the two Dropouts are identities in eval mode: the exporter drops them, so
    # only their values can place them (and a value match proves nothing)
    by_value = {m["module"]: m for m in cc["matches"] if m["method"] == "value"}
    assert set(by_value) == {"blocks.0.drop", "blocks.1.drop"}
    assert all(m["reason"] == "no_nodes" for m in by_value.values())
    assert cov["by_metadata"] == 26 and cov["by_value"] == 2 and cov["unmapped"] == 0
    q = next(m for m in cc["matches"] if m["module"] == "blocks.0.attn.q")
    assert q["method"] == "metadata" and q["onnx_tensor"] == "linear" and q["max_abs"] < 1e-5
    root = next(m for m in cc["matches"] if m["module"] == "(root)")
    assert root["onnx_tensor"] == tiny.info.outputs[0]
    # the typed record writes crosscheck.json back key for key, in order
    from bisect_tui.core.triage.records import FrameworkResult

    saved = json.loads((tiny._torch.dir / "crosscheck.json").read_text())
    record = tiny.framework_result
    assert isinstance(record, FrameworkResult) and record.export_matches and record.golden["deterministic"]
    assert record.to_json() == saved and list(record.to_json()) == list(saved)
    assert FrameworkResult.from_json(saved) == record


def test_reference_interface_is_shared(tiny):
    from bisect_tui.core.baseline import load_tensor
    from bisect_tui.frontends.torch.reference import TorchHooksReference

    feeds = tiny.inputs.feeds(0)
    ort_ref = UnfusedModel(OrtUnfused(), tiny.info.model)
    hooks = TorchHooksReference(tiny._torch.loaded)
    assert isinstance(ort_ref, Reference) and isinstance(hooks, Reference)
    fresh = ort_ref.run(feeds, ["linear"])["linear"]
    np.testing.assert_array_equal(fresh, load_tensor(tiny.session, tiny.baseline.manifest, "linear")[0])
    got = hooks.run(feeds, ["layer_0001_blocks.0.attn.q"])["layer_0001_blocks.0.attn.q"]
    gold = np.load(tiny.session.root / "torch" / "golden" / "layer_0001_blocks.0.attn.q.npy")[0]
    np.testing.assert_array_equal(got, gold)


def test_torch_arbiter_uses_pytorch_float64(tiny):
    arb = tiny.arbiter
    assert arb["available"] and arb["truth_source"].startswith("PyTorch") and "float64" in arb["truth_source"]
    (name, o), = arb["outputs"].items()
    assert name == tiny.info.outputs[0]
    assert 0 < o["baseline"]["rmse"] < 1e-5 and 0 < o["framework"]["rmse"] < 1e-5
    assert o["not_worse"] and o["ratio"] <= 2.0


def test_torchscript_exporter_maps_through_node_names(tmp_path):
    t = triage(tmp_path, "tiny_transformer", exporter="torchscript")
    assert t._torch.record["exporter"] == "torchscript"
    assert t.info.index.nodes[0].name.startswith("/blocks/blocks.0/")
    cov = t.framework["crosscheck"]["coverage"]
    assert t.framework["crosscheck"]["passed"]
    assert cov["by_metadata"] == 26 and cov["by_value"] == 2 and cov["unmapped"] == 0


def test_training_mode_model_is_flagged_and_golden_data_is_eval(tmp_path):
    t = triage(tmp_path, "cnn_in_training")
    p = pitfall(t, "training_mode")
    assert p["state"] == "found"
    assert "bn1 (BatchNorm2d)" in p["detail"] and "bn2 (BatchNorm2d)" in p["detail"]
    moved = float(p["detail"].rsplit("max abs ", 1)[1])
    assert moved > 0.05  # batch statistics really change the output
    mod = t._torch.loaded.module
    assert not any(m.training for m in mod.modules())
    ex = t._torch.loaded.example_inputs
    with torch.no_grad():
        eval_out = mod(*ex).numpy()
    gold = np.load(t.session.root / "torch" / "golden" / "layer_0008_model.npy")
    np.testing.assert_array_equal(gold[0], eval_out)  # golden data is the eval-mode result
    assert t.summary()["verdict"] == "pass"


def test_broken_export_caught_before_any_engine(tmp_path):
    """The TorchScript tracer bakes float(x.abs().max()) of the example input into
    the graph: on another input the export is wrong. The dynamo exporter keeps it
    a graph op, and the same check passes."""
    other = tmp_path / "other.npz"
    x = torch.randn(1, 16, generator=torch.Generator().manual_seed(99)) * 3
    np.savez(other, x=x.numpy())
    t = triage(tmp_path, "baked_scale", exporter="torchscript", input_file=other)
    s = t.summary()
    assert s["verdict"] == "export_mismatch" and s["exit_code"] == 1
    first = t.framework["crosscheck"]["first_failing"]
    assert first["module"] == "(root)" and first["max_abs"] > 0.5
    assert pitfall(t, "export_baked_values")["state"] == "found"
    assert "Python float" in pitfall(t, "export_baked_values")["detail"]
    assert t.fused is None and not t.session.path("check.json").exists()  # no engine was judged
    ok = triage(tmp_path / "dyn", "baked_scale", exporter="dynamo", input_file=other)
    assert ok.framework["export_matches"] and ok.summary()["verdict"] == "pass"


def test_softmax_on_one_side_is_named(tmp_path):
    t = triage(tmp_path, "softmax_on_export", exporter="torchscript")
    assert t.summary()["verdict"] == "export_mismatch"
    p = pitfall(t, "softmax_one_side")
    assert p["state"] == "found" and "the ONNX export applies a softmax" in p["detail"]


def test_nondeterministic_forward_stops_with_exit_3(tmp_path):
    t = triage(tmp_path, "stubborn_dropout", exporter="torchscript")
    assert t.framework["golden"]["deterministic"] is False
    assert pitfall(t, "nondeterministic")["state"] == "found"
    assert t.summary()["exit_code"] == 3


def test_weights_written_in_forward_are_caught(tmp_path):
    t = triage(tmp_path, "drifting_buffer", exporter="torchscript")
    p = pitfall(t, "weights_changed")
    assert p["state"] == "found" and "state_dict differs" in p["detail"]


def test_unseeded_factory_caught_in_the_run_and_on_rerun(tmp_path):
    t = triage(tmp_path, "unseeded", exporter="torchscript")
    p = pitfall(t, "weights_changed")
    assert p["state"] == "found" and "two calls of the factory" in p["detail"]
    with pytest.raises(UserError, match="weights changed since this session was made"):
        Triage(TriageOptions(model=None, session_dir=tmp_path / "unseeded",
                             torch=spec("unseeded", "torchscript"))).prepare()


def test_half_model_compared_in_fp32(tmp_path):
    t = triage(tmp_path, "half_mlp", exporter="torchscript")
    p = pitfall(t, "dtype")
    assert p["state"] == "found" and "torch.float16, converted to float32" in p["detail"]
    assert t.framework["export_matches"]


def test_detectors_on_real_tensors():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 10, generator=g)
    assert softmax_side(logits.numpy(), torch.softmax(logits, -1).numpy()) == "onnx"
    assert softmax_side(torch.softmax(logits, -1).numpy(), logits.numpy()) == "torch"
    assert softmax_side(logits.numpy(), (logits * 1.5).numpy()) is None
    assert batch_permutation(logits.numpy(), logits.flip(0).numpy()) == [3, 2, 1, 0]
    assert batch_permutation(logits.numpy(), logits.numpy()) is None  # same order: nothing to report


def test_cli_torch_check_and_usage_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # the dotted form resolves from the working directory
    out = tmp_path / "r.json"
    rc = main(["check", "--torch", "sample_models.torch_models:small_cnn", "--shape", "x=1x3x16x16",
               "--exporter", "torchscript", "--session", str(tmp_path / "s"), "--json", str(out), "-q"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "exported with the torchscript exporter" in text and "export cross-check:" in text
    data = json.loads(out.read_text())
    cov = data["framework"]["crosscheck"]["coverage"]
    assert cov["modules"] == 9 and cov["mapped_modules"] == 7 and cov["unmapped"] == 2
    # the tracer folds each batch norm into its convolution: conv1 and conv2 have no tensor of their own
    assert set(cov["unmapped_reasons"]["merged"]["modules"]) == {"conv1", "conv2"}
    assert data["framework"]["crosscheck"]["passed"]
    assert data["arbiter"]["available"]
    for argv, message in [
        (["check", "--torch", "sample_models.torch_models:small_cnn"], "--shape x=DIMS"),
        (["check", "m.onnx", "--torch", "a:b"], "not both"),
        (["check", "--torch", "no_colon"], "expected module.path:factory"),
        (["check", "--torch", "sample_models.torch_models:nope"], "has no callable 'nope'"),
        (["check"], "no model"),
        (["tui", "--torch", "sample_models.torch_models:nope"], "has no callable 'nope'"),  # before any screen
    ]:
        rc = main(argv + ["--session", str(tmp_path / "bad"), "-q"])
        err = capsys.readouterr().err
        assert rc == 2 and message in err and "Traceback" not in err, (argv, err)


def test_spec_vs_path():
    assert looks_like_spec("sample_models.torch_models:tiny_transformer")
    assert not looks_like_spec("C:/models/x.onnx") and not looks_like_spec(str(MODELS))
    with pytest.raises(UserError):
        TorchSpec.parse("a b:c")


def test_auto_falls_back_to_torchscript_and_the_baked_branch_is_caught(tmp_path):
    """torch.export refuses an `if` on a tensor value; auto says why and uses the
    tracer, which keeps the branch the example input took. An input that takes
    the other branch shows the export is wrong."""
    import importlib.util

    mod_spec = importlib.util.spec_from_file_location("tm_for_test", MODELS)
    tm = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(tm)
    model, (x0,) = tm.data_branch()
    w, b = model.fc.weight.detach(), model.fc.bias.detach()
    direction = w.sum(0)
    x = -(b.sum() + 1.0) / direction.dot(direction) * direction  # fc(x).sum() == -1: the other branch
    with torch.no_grad():
        assert float(model.fc(x0).sum()) > 0 > float(model.fc(x[None]).sum())
    other = tmp_path / "other.npz"
    np.savez(other, x=x[None].numpy().astype(np.float32))
    t = triage(tmp_path, "data_branch", input_file=other)
    rec = t._torch.record
    assert rec["exporter"] == "torchscript" and rec["exporter_requested"] == "auto"
    assert "GuardOnDataDependentSymNode" in rec["fallback_reason"]
    assert "Python boolean" in pitfall(t, "export_baked_values")["detail"]
    assert t.summary()["verdict"] == "export_mismatch"


@pytest.mark.slow
def test_golden_dump_memory_stays_bounded(tmp_path):
    """40 module outputs of 4 MB each: the hooks stream each to disk as it comes,
    so once warm the process grows by a few tensors (4-10 MB measured), not by
    the 164 MB dumped."""
    from bisect_tui.frontends.torch.hooks import run_recorded

    class Scale(torch.nn.Module):
        def forward(self, x):
            return x * 1.001

    x = torch.randn(1, 1 << 20, generator=torch.Generator().manual_seed(0))
    (tmp_path / "warm").mkdir()
    run_recorded(torch.nn.Sequential(*[Scale() for _ in range(5)]), [(x,)], tmp_path / "warm")  # allocator warm-up
    rec = run_recorded(torch.nn.Sequential(*[Scale() for _ in range(40)]).eval(), [(x,)], tmp_path)
    dumped = sum(e["bytes"] for e in rec.entries)
    assert dumped == 41 * (4 << 20)  # 40 children and the root
    assert rec.rss_peak - rec.rss_start < dumped / 5, (rec.rss_peak - rec.rss_start) / 2**20
    np.testing.assert_allclose(np.load(tmp_path / rec.entries[4]["file"])[0], (x * 1.001 ** 5).numpy(), rtol=1e-6)
