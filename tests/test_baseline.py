"""Baseline dumps: names, manifest, memory-bounded groups, resume after interruption."""

from __future__ import annotations

import hashlib

import numpy as np
import onnxruntime as ort
import pytest

from bisect_tui.core.cancel import CancelToken, Progress
from bisect_tui.core.errors import Cancelled
from bisect_tui.core.pipeline import Triage, TriageOptions


def _triage(model, tmp_path, name="s", **kw):
    return Triage(TriageOptions(model=model, session_dir=tmp_path / name, **kw))


def test_baseline_files_manifest_and_values(tiny_model, tmp_path):
    t = _triage(tiny_model, tmp_path, samples=2, seed=3)
    t.prepare()
    res = t.run_baseline()
    files = sorted(p.name for p in t.session.baseline_dir.glob("*.npy"))
    assert files == ["layer_0000_MatMul_a.npy", "layer_0001_Relu_b.npy", "layer_0002_Mul_y.npy"]
    m = res.manifest
    assert [e["tensor"] for e in m["tensors"]] == ["a", "b", "y"]
    assert [e["node"] for e in m["tensors"]] == ["mm", "relu", "square"]
    # the exact input is saved and the dump equals an independent ORT run on it
    x = np.load(t.session.inputs_path)["x"]
    assert x.shape == (2, 2, 8)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(tiny_model), so, providers=["CPUExecutionProvider"])
    y = np.load(t.session.baseline_dir / "layer_0002_Mul_y.npy")
    for k in range(2):
        np.testing.assert_array_equal(y[k], sess.run(["y"], {"x": x[k]})[0])
    e = m["tensors"][2]
    assert e["sha256"] == hashlib.sha256(y.tobytes()).hexdigest()
    assert e["shape"] == [2, 8] and e["dtype"] == "float32"
    assert e["stats"]["abs_max"] == pytest.approx(float(np.abs(y).max()))
    assert e["stats"]["fp16_overflow"] == int((np.abs(y) > 65504).sum()) > 0
    assert (t.session.baseline_dir / "run.json").exists()
    assert not list(t.session.baseline_dir.glob(".tmp_*"))


def test_small_budget_splits_into_groups_with_identical_results(tiny_model, tmp_path):
    one = _triage(tiny_model, tmp_path, "one", max_memory=4 << 30)
    one.prepare()
    r1 = one.run_baseline()
    many = _triage(tiny_model, tmp_path, "many", max_memory=1)  # forces one tensor per group
    many.prepare()
    r2 = many.run_baseline()
    assert r1.manifest["options"]["groups"] == 1
    assert r2.manifest["options"]["groups"] == 3
    assert [e["sha256"] for e in r1.manifest["tensors"]] == [e["sha256"] for e in r2.manifest["tensors"]]


def test_interrupted_baseline_resumes_without_redoing_groups(tiny_model, tmp_path):
    token = CancelToken()
    seen = []

    def progress(p: Progress):
        seen.append(p)
        if p.stage == "baseline" and p.data.get("group") == 1:
            token.cancel()  # stop right after the first group is on disk

    t = Triage(TriageOptions(model=tiny_model, session_dir=tmp_path / "s", max_memory=1), progress, token)
    t.prepare()
    with pytest.raises(Cancelled):
        t.run_baseline()
    sdir = t.session.baseline_dir
    assert not (sdir / "manifest.json").exists()
    assert (sdir / "manifest.partial.json").exists()
    first = sdir / "layer_0000_MatMul_a.npy"
    mtime = first.stat().st_mtime_ns
    groups = []
    t2 = Triage(TriageOptions(model=tiny_model, session_dir=tmp_path / "s", max_memory=1),
                lambda p: groups.append(p.data.get("groups")))
    t2.prepare()
    res = t2.run_baseline()
    assert first.stat().st_mtime_ns == mtime  # not rewritten
    assert max(g for g in groups if g) == 2  # only the two missing tensors were run
    assert len(res.manifest["tensors"]) == 3
    assert not (sdir / "manifest.partial.json").exists()
    # a third run reuses everything
    t3 = _triage(tiny_model, tmp_path, "s", max_memory=1)
    t3.prepare()
    assert t3.run_baseline().reused


def test_corrupted_tensor_file_is_not_trusted(tiny_model, tmp_path):
    t = _triage(tiny_model, tmp_path)
    t.prepare()
    t.run_baseline()
    f = t.session.baseline_dir / "layer_0001_Relu_b.npy"
    f.write_bytes(f.read_bytes()[:20])  # truncated, as after a crash of another tool
    t2 = _triage(tiny_model, tmp_path)
    t2.prepare()
    assert not t2.run_baseline().reused
    assert np.load(f).shape == (1, 2, 8)


def test_models_over_the_protobuf_limit_load_through_external_data(tiny_model, tmp_path, monkeypatch):
    """Models above 2 GB cannot be serialized in one protobuf; the unfused
    reference then writes the weights to an external file. Exercised by
    lowering the limit."""
    from bisect_tui.engines.ort import unfused

    small = _triage(tiny_model, tmp_path, "normal")
    small.prepare()
    expected = [e["sha256"] for e in small.run_baseline().manifest["tensors"]]
    monkeypatch.setattr(unfused, "PROTO_LIMIT", 10)
    big = _triage(tiny_model, tmp_path, "external")
    big.prepare()
    assert [e["sha256"] for e in big.run_baseline().manifest["tensors"]] == expected


class _Recorded:
    """The ONNX Runtime reference, with every session it opens recorded and a
    version of its own: what the triage is handed is what the baseline uses."""

    def __init__(self):
        from bisect_tui.engines.ort.unfused import OrtUnfused

        self.inner = OrtUnfused()
        self.name, self.label, self.library, self.mode, self.spec = (
            "recorded " + self.inner.name, self.inner.label, self.inner.library, "recorded", self.inner.spec)
        self.opened: list[list[str]] = []

    def session(self, model):
        s = self.inner.session(model)
        self.opened.append(s.output_names())
        return s

    def versions(self):
        return {**self.inner.versions(), "recorded": "1"}

    def cache_key(self):
        return "recorded/" + self.inner.cache_key()

    def settings(self):
        return {**self.inner.settings(), "optimization": "recorded"}

    def error_text(self, exc):
        return self.inner.error_text(exc)

    def check_loadable(self, model, path):
        self.inner.check_loadable(model, path)

    def warm_up(self):
        self.inner.warm_up()


def test_the_baseline_runs_on_the_reference_it_is_handed(tiny_model, tmp_path):
    """Triage(reference=...) is the only unfused side: the dump's sessions, the
    1-ulp run in its last session, its manifest options, versions and cache key
    all come from it; the same dump under the default reference is another key."""
    ref = _Recorded()
    t = Triage(TriageOptions(model=tiny_model, session_dir=tmp_path / "r", check_determinism=False), reference=ref)
    t.prepare()
    res = t.run_baseline()
    assert ref.opened == [["a", "b", "y"]]  # one group, every tensor marked; the 1-ulp run reused it
    m = res.manifest
    assert m["options"]["optimization"] == "recorded" and m["options"]["provider"] == "CPUExecutionProvider"
    run = t.session.read_json("baseline/run.json")
    assert run["versions"]["recorded"] == "1" and run["versions"]["onnxruntime"] == ort.__version__
    plain = _triage(tiny_model, tmp_path, "plain", check_determinism=False)
    plain.prepare()
    other = plain.run_baseline().manifest
    assert other["key"] != m["key"] and other["options"]["optimization"] == "ORT_DISABLE_ALL"
    assert [e["sha256"] for e in other["tensors"]] == [e["sha256"] for e in m["tensors"]]
