"""Baseline packs: a large model's small tensors in one `.npz` per group.

Real ORT dumps of a 600-node chain (above PACK_MIN_TENSORS) with one branch
of tensors above PACK_TENSOR_BYTES, so both layouts live in one session."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from bisect_tui.core import baseline_pack
from bisect_tui.core.baseline import entry_problem, load_manifest, load_tensor
from bisect_tui.core.cancel import CancelToken, Progress
from bisect_tui.core.compare.loading import load_source, read_array
from bisect_tui.core.errors import Cancelled, UserError
from bisect_tui.core.pipeline import Triage, TriageOptions
from testlib import init, make_model, vi

CHAIN = 600
BIG = 20000  # floats: 80 KB a sample, above the 64 KiB pack limit


@pytest.fixture(scope="module")
def chain_model(tmp_path_factory):
    nodes, inits = [], [init("c_add", np.float32(0.01)), init("c_mul", np.float32(0.999))]
    prev = "x"
    for i in range(CHAIN):
        out = f"t/{i}:0"  # slashes and colons, as exported models name tensors
        op = ("Add", "Mul", "Relu")[i % 3]
        ins = [prev] if op == "Relu" else [prev, "c_add" if op == "Add" else "c_mul"]
        nodes.append(helper.make_node(op, ins, [out], name=f"n{i}"))
        prev = out
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="last"))
    nodes += [helper.make_node("Relu", ["w"], ["big_a"], name="ba"),
              helper.make_node("Neg", ["big_a"], ["big_b"], name="bb"),
              helper.make_node("Neg", ["big_b"], ["z"], name="bz")]
    m = make_model(nodes, [vi("x", [1, 8]), vi("w", [1, BIG])], [vi("y", [1, 8]), vi("z", [1, BIG])], inits)
    path = tmp_path_factory.mktemp("pack") / "chain.onnx"
    onnx.save(m, str(path))
    return path


def _triage(model, root, name="s", **kw):
    return Triage(TriageOptions(model=model, session_dir=root / name, samples=2, seed=5,
                                check_determinism=False, **kw))


def _dumped(model, root, name="s", **kw):
    t = _triage(model, root, name, **kw)
    t.prepare()
    return t, t.run_baseline()


def _ort_values(model, feeds, names):
    """The same tensors from an independent ORT_DISABLE_ALL session."""
    m = onnx.load(str(model))
    m.graph.output.extend([helper.make_empty_tensor_value_info(n) for n in names])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return dict(zip(names, s.run(names, feeds)))


def test_small_tensors_are_packed_with_clear_names_and_right_values(chain_model, tmp_path):
    t, res = _dumped(chain_model, tmp_path)
    base = t.session.baseline_dir
    entries = {e["tensor"]: e for e in res.manifest["tensors"]}
    assert len(entries) == CHAIN + 4  # the chain, y, and the big branch (big_a, big_b, the output z)
    packs = sorted(p.name for p in base.glob("pack_*.npz"))
    assert len(packs) == 1
    packed = [e for e in entries.values() if "member" in e]
    own = sorted(e["file"] for e in entries.values() if "member" not in e)
    assert len(packed) == CHAIN + 1
    assert own == ["layer_0601_Relu_big_a.npy", "layer_0602_Neg_big_b.npy", "layer_0603_Neg_z.npy"]
    assert sorted(p.name for p in base.glob("*.npy")) == own  # no per-tensor file for a packed tensor
    e = entries["t/7:0"]
    assert e["file"] == packs[0] and e["member"] == "layer_0007_Mul_t_7_0.npy"
    # numpy reads the pack with the per-tensor names; the values are ORT's
    x = np.load(t.session.inputs_path)
    want = [_ort_values(chain_model, {"x": x["x"][k], "w": x["w"][k]}, ["t/7:0", "t/599:0", "big_b"])
            for k in range(2)]
    with np.load(base / packs[0]) as z:
        assert len(z.files) == CHAIN + 1
        assert z["layer_0007_Mul_t_7_0"].shape == (2, 1, 8)
        for k in range(2):
            np.testing.assert_array_equal(z["layer_0007_Mul_t_7_0"][k], want[k]["t/7:0"])
    with zipfile.ZipFile(base / packs[0]) as zf:
        assert zf.testzip() is None and all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())
    for name in ("t/7:0", "t/599:0", "big_b"):
        got = load_tensor(t.session, res.manifest, name)
        for k in range(2):
            np.testing.assert_array_equal(got[k], want[k][name])
        assert hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest() == entries[name]["sha256"]
    assert not list(base.glob(".tmp_*"))
    # reused as a whole by a second run, every packed digest checked
    t2, res2 = _dumped(chain_model, tmp_path)
    assert res2.reused and load_manifest(t2.session) is not None


def test_a_changed_byte_in_a_pack_recomputes_only_that_tensor(chain_model, tmp_path):
    t, res = _dumped(chain_model, tmp_path)
    base = t.session.baseline_dir
    e = next(e for e in res.manifest["tensors"] if e["tensor"] == "t/300:0")
    pack = base / e["file"]
    data = bytearray(pack.read_bytes())
    start = baseline_pack.member_at(bytes(data), e["offset"])[2]
    data[start + 3] ^= 0x40  # one value, as a disk or an editor might change it
    pack.write_bytes(bytes(data))
    assert entry_problem(base, e, 2) == "contents differ from the SHA-256 written with it"
    t2, res2 = _dumped(chain_model, tmp_path)
    assert not res2.reused and [b["tensor"] for b in res2.recomputed] == ["t/300:0"]
    new = next(x for x in res2.manifest["tensors"] if x["tensor"] == "t/300:0")
    assert new["file"] != e["file"] and new["sha256"] == e["sha256"]  # a new pack holds the one recomputed
    assert load_manifest(t2.session) is not None
    got = load_tensor(t2.session, res2.manifest, "t/300:0")
    for k in range(2):
        np.testing.assert_array_equal(got[k], _ort_values(chain_model, _feeds(t2, k), ["t/300:0"])["t/300:0"])


def _feeds(t, k):
    x = np.load(t.session.inputs_path)
    return {"x": x["x"][k], "w": x["w"][k]}


@pytest.mark.parametrize("edit, why", [
    (lambda e: e.update(member="../evil.npy"), "is not a plain name"),
    (lambda e: e.update(file="../chain.onnx"), "is not a plain name"),
    (lambda e: e.update(offset=10 ** 9), "unreadable"),
    (lambda e: e.update(offset="12"), "unreadable"),
    (lambda e: e.update(offset=e["offset"] - 1), "unreadable"),  # not the start of a .npy
])
def test_edited_pack_entries_are_not_trusted(chain_model, tmp_path, edit, why):
    t, res = _dumped(chain_model, tmp_path)
    e = dict(next(e for e in res.manifest["tensors"] if e["tensor"] == "t/10:0"))
    edit(e)
    assert why in entry_problem(t.session.baseline_dir, e, 2)


def test_an_entry_pointing_at_another_member_fails_its_digest(chain_model, tmp_path):
    t, res = _dumped(chain_model, tmp_path)
    by = {e["tensor"]: e for e in res.manifest["tensors"]}
    e = dict(by["t/10:0"], offset=by["t/12:0"]["offset"])  # t/11 is a Relu of it: the same bytes
    assert entry_problem(t.session.baseline_dir, e, 2) == "contents differ from the SHA-256 written with it"


def test_interrupted_packed_dump_resumes_from_its_finished_packs(chain_model, tmp_path, monkeypatch):
    from bisect_tui.core import baseline

    monkeypatch.setattr(baseline, "activation_budget", lambda *a: 200 * 32)  # ~200 chain tensors a group
    token = CancelToken()

    def progress(p: Progress):
        if p.stage == "baseline" and p.data.get("group") == 1:
            token.cancel()  # right after the first group's pack is in place

    opts = TriageOptions(model=chain_model, session_dir=tmp_path / "s", samples=2, seed=5,
                         check_determinism=False)
    t = Triage(opts, progress, token)
    t.prepare()
    with pytest.raises(Cancelled):
        t.run_baseline()
    base = t.session.baseline_dir
    partial = json.loads((base / "manifest.partial.json").read_text())
    done = [e for e in partial["tensors"]]
    assert 0 < len(done) < CHAIN and all((base / e["file"]).is_file() for e in done)
    first_packs = {e["file"] for e in done if "member" in e}
    assert not list(base.glob(".tmp_*"))
    mtimes = {p: (base / p).stat().st_mtime_ns for p in first_packs}
    t2 = Triage(opts)
    t2.prepare()
    res = t2.run_baseline()
    assert len(res.manifest["tensors"]) == CHAIN + 4 and res.manifest["options"]["groups"] > 1
    assert len(list(base.glob("pack_*.npz"))) > 1
    assert {p: (base / p).stat().st_mtime_ns for p in first_packs} == mtimes  # not rewritten
    for e in res.manifest["tensors"]:
        assert entry_problem(base, e, 2) is None
    fresh, fres = _dumped(chain_model, tmp_path, "fresh")
    assert ([e["sha256"] for e in res.manifest["tensors"]] == [e["sha256"] for e in fres.manifest["tensors"]])


def test_compare_reads_packed_session_tensors_and_checks_their_digests(chain_model, tmp_path):
    t, res = _dumped(chain_model, tmp_path)
    src = load_source(t.session.root, "GOLDEN")
    by = {x.name: x for x in src.tensors}
    np.testing.assert_array_equal(read_array(by["t/42:0"], "GOLDEN"), load_tensor(t.session, res.manifest, "t/42:0"))
    np.testing.assert_array_equal(read_array(by["big_a"], "GOLDEN"), load_tensor(t.session, res.manifest, "big_a"))
    e = next(e for e in res.manifest["tensors"] if e["tensor"] == "t/42:0")
    pack = t.session.baseline_dir / e["file"]
    data = bytearray(pack.read_bytes())
    data[baseline_pack.member_at(bytes(data), e["offset"])[2]] ^= 1
    pack.write_bytes(bytes(data))
    with pytest.raises(UserError, match="does not match the SHA-256"):
        read_array(load_source(t.session.root, "GOLDEN").tensors[42], "GOLDEN")


def test_a_small_model_keeps_one_file_per_tensor(tiny_model, tmp_path):
    t, res = _dumped(tiny_model, tmp_path)
    assert not list(t.session.baseline_dir.glob("pack_*")) and all("member" not in e for e in res.manifest["tensors"])


def test_packed_statistics_equal_the_per_tensor_path(chain_model, tmp_path):
    """A pack's statistics are computed for the whole group at once; each must be
    what the per-tensor path gives for the same samples, to the last bit as JSON."""
    from bisect_tui.core.stats import empty_stats, finish_stats, update_stats

    t, res = _dumped(chain_model, tmp_path)
    packed = [e for e in res.manifest["tensors"] if "member" in e]
    assert len(packed) == CHAIN + 1
    for e in packed[::37] + packed[-2:]:
        got = load_tensor(t.session, res.manifest, e["tensor"])
        st = empty_stats()
        for k in range(got.shape[0]):
            update_stats(st, np.ascontiguousarray(got[k]))
        assert json.dumps(e["stats"]) == json.dumps(finish_stats(st)), e["tensor"]
    assert all(e["stats"]["numel"] == 16 and e["stats"]["finite"] == 16 for e in packed)


def _samples(rng, kind, n, samples):
    out = []
    for s in range(samples):
        if kind == 0:
            a = rng.standard_normal(n).astype(np.float32)
        elif kind == 1:  # past FP16's range
            a = (rng.standard_normal(n) * 1e5).astype(np.float32)
        elif kind == 2:  # below FP16's and BF16's smallest
            a = (rng.standard_normal(n) * 1e-30).astype(np.float32)
        elif kind == 3:  # zeros, -0.0 and float32 subnormals
            a = np.zeros(n, np.float32)
            a[::3], a[::5], a[::7] = -0.0, 1e-40, -3e-39
        elif kind == 4:  # a NaN in one sample only: the per-tensor path's job
            a = rng.standard_normal(n).astype(np.float32)
            a[0] = np.nan if s == 0 else 1.0
        elif kind == 5:  # an Inf in the last sample
            a = np.full(n, 2.0, np.float32)
            a[-1] = np.inf if s == samples - 1 else 2.0
        else:  # not contiguous
            a = rng.standard_normal((n, 2)).astype(np.float32)[:, 0]
        out.append(a)
    return out


def test_batched_statistics_match_update_stats_or_step_aside():
    from bisect_tui.core.stats import empty_stats, finish_stats, finished_f32_many, update_stats

    rng = np.random.default_rng(3)
    tensors = [_samples(rng, k % 7, int(rng.integers(1, 3000)), int(rng.integers(1, 4))) for k in range(700)]
    tensors += [[np.array(1.5, np.float32)], [np.zeros(0, np.float32)], [np.ones(3, np.int64)],
                [np.ones(3, np.float16)]]
    got = finished_f32_many(tensors)
    done = 0
    for k, (g, samples) in enumerate(zip(got, tensors)):
        special = (k < 700 and k % 7 in (4, 5)) or k >= 701
        if g is None:
            assert special, k  # only NaN/Inf, empty and other dtypes step aside
            continue
        assert not special, k
        st = empty_stats()
        for a in samples:
            update_stats(st, a)
        assert json.dumps(g) == json.dumps(finish_stats(st)), k
        done += 1
    assert done == 700 - 200 + 1  # 5 of every 7 kinds, and the 0-d tensor


def test_pack_writer_gives_a_plain_zip_and_zip64_past_65535_members(tmp_path):
    import shutil
    import subprocess

    w = baseline_pack.PackWriter(tmp_path)
    offsets = {}
    for i in range(70000):  # past the plain end record's member count
        arr = np.array([i, -i], np.float32)
        buf = io.BytesIO()
        np.save(buf, arr)
        offsets[f"m{i}é.npy" if i == 3 else f"m{i}.npy"] = (w.add(f"m{i}é.npy" if i == 3 else f"m{i}.npy",
                                                                buf.getvalue()), arr)
    path = w.close("pack.npz")
    data = path.read_bytes()
    for name in ("m0.npy", "m3é.npy", "m69999.npy"):
        off, arr = offsets[name]
        np.testing.assert_array_equal(baseline_pack.array_at(data, off), arr)
    with zipfile.ZipFile(path) as zf:
        assert len(zf.infolist()) == 70000 and zf.testzip() is None
        assert zf.read("m3é.npy") == data[offsets["m3é.npy"][0]:][:zf.getinfo("m3é.npy").file_size]
    with np.load(path) as z:
        np.testing.assert_array_equal(z["m69999"], np.array([69999, -69999], np.float32))
        np.testing.assert_array_equal(z["m3é"], np.array([3, -3], np.float32))
    if shutil.which("unzip"):
        r = subprocess.run(["unzip", "-tqq", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def test_batched_statistics_are_the_same_in_small_batches(monkeypatch):
    """A group's statistics are computed in batches of whole tensors (a 21,000-tensor
    group made 3.2 GB of temporaries in one): every batch size gives the same JSON,
    the tensors a batch cannot take included."""
    from bisect_tui.core import stats

    rng = np.random.default_rng(5)
    tensors = [_samples(rng, k % 7, int(rng.integers(1, 3000)), int(rng.integers(1, 4))) for k in range(300)]
    monkeypatch.setattr(stats, "BATCH_ELEMENTS", 1 << 40)
    whole = stats.finished_f32_many(tensors)
    assert sum(g is not None for g in whole) > 150
    for batch in (1, 2500, 40000):
        monkeypatch.setattr(stats, "BATCH_ELEMENTS", batch)
        assert json.dumps(stats.finished_f32_many(tensors)) == json.dumps(whole), batch
