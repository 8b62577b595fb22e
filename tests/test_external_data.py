"""Models whose weights live in external data files (every model over 2 GB).

The path for them is chosen by the presence of external data, not by size, so
these small models (3 MB of weights, in a file beside the model or in a
subfolder) run exactly the code a 2.4 GB model runs: loaded without their
weights, the session's own verified copy, ORT reading the weights from their
folder, derived models linking them. A spy on ModelProto.SerializeToString
(the real method still runs) proves that nothing in this process serializes
the model together with its weights."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisect_tui.cli import main
from testlib import init, make_model, vi

N = 512  # 3 weights of 512x512 float32: 3 MB of external data
GELU_NODES = ["gelu/div", "gelu/erf", "gelu/add_one", "gelu/mul_x", "gelu/mul_half"]


def gelu_mlp() -> onnx.ModelProto:
    """MatMul -> erf Gelu -> MatMul -> MatMul: ORT fuses the Gelu, and with its
    Gelu approximation on (FastGelu) the output leaves the fp32 tolerance."""
    rng = np.random.default_rng(0)
    w = [(rng.standard_normal((N, N)) * (2.0 / np.sqrt(N))).astype(np.float32) for _ in range(3)]
    nodes = [
        helper.make_node("MatMul", ["x", "W0"], ["h"], name="fc0"),
        helper.make_node("Div", ["h", "sqrt2"], ["d"], name="gelu/div"),
        helper.make_node("Erf", ["d"], ["e"], name="gelu/erf"),
        helper.make_node("Add", ["e", "one"], ["e1"], name="gelu/add_one"),
        helper.make_node("Mul", ["h", "e1"], ["hm"], name="gelu/mul_x"),
        helper.make_node("Mul", ["hm", "half"], ["g"], name="gelu/mul_half"),
        helper.make_node("MatMul", ["g", "W1"], ["y1"], name="fc1"),
        helper.make_node("MatMul", ["y1", "W2"], ["y"], name="fc2"),
    ]
    inits = [init("W0", w[0]), init("W1", w[1]), init("W2", w[2]), init("sqrt2", np.float32(np.sqrt(2.0))),
             init("one", np.float32(1.0)), init("half", np.float32(0.5))]
    return make_model(nodes, [vi("x", [4, N])], [vi("y", [4, N])], inits)


def save_external(model: onnx.ModelProto, path: Path, location: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=1024)
    assert (path.parent / location).stat().st_size >= 3 * N * N * 4
    return path


@pytest.fixture
def serialize_spy(monkeypatch):
    """The largest ModelProto this process serializes (the real method runs)."""
    sizes: list[int] = []
    real = onnx.ModelProto.SerializeToString

    def spy(self, *a, **k):
        out = real(self, *a, **k)
        sizes.append(len(out))
        return out

    monkeypatch.setattr(onnx.ModelProto, "SerializeToString", spy)
    return sizes


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("location", ["mlp.weights", "data/sub/mlp.weights"])
def test_check_runs_an_external_data_model_from_its_files(tmp_path, location, capsys, serialize_spy):
    from bisect_tui.core.external_data import file_digest
    from bisect_tui.core.model import load_model_info

    model = save_external(gelu_mlp(), tmp_path / "user" / "mlp.onnx", location)
    data = model.parent / location
    info = load_model_info(model)
    # the path for external data, taken by this 3 MB model: no weights in the proto
    assert info.external and info.external[0]["location"] == location
    assert info.model.ByteSize() < 20_000
    assert all(not t.raw_data for t in info.model.graph.initializer if t.name.startswith("W"))

    session, js = tmp_path / "s", tmp_path / "check.json"
    code, out, err = run(["check", model, "--session", session, "--json", js], capsys)
    assert code == 0, out + err
    d = json.loads(js.read_text())
    assert d["verdict"] == "pass" and d["outputs"]["y"]["passed"]
    # the float64 arbiter read the weights with our reader, the baseline through ORT's
    # external-data folder: had either missed the weights they would disagree
    base = d["arbiter"]["outputs"]["y"]["baseline"]
    assert base["rmse"] < 1e-4 * max(1.0, float(np.abs(np.load(session / "input.npz")["x"]).max()))
    # nothing in this process serialized the model with its 3 MB of weights
    assert serialize_spy and max(serialize_spy) < 100_000
    meta = json.loads((session / "session.json").read_text())
    rec = meta["external_data"][0]
    copy = session / rec["session_file"]
    assert rec["location"] == location and rec["stored_as"] == "copied" and rec["sha256_verified"]
    assert file_digest(copy) == rec["sha256"] == file_digest(data)
    # a copy, never a link: onnx refuses a data file with two links, the user's own load would break
    assert os.stat(data).st_nlink == 1
    onnx.load(str(model))
    big = [p for p in session.rglob("*.onnx") if p.stat().st_size > 100_000]
    assert not big, big  # every model file the session holds keeps its weights outside


def test_reused_weights_are_verified_and_other_weights_are_another_model(tmp_path, capsys):
    model = save_external(gelu_mlp(), tmp_path / "user" / "mlp.onnx", "w/mlp.weights")
    session = tmp_path / "s"
    assert run(["check", model, "--session", session], capsys)[0] == 0
    rec = json.loads((session / "session.json").read_text())["external_data"][0]
    copy = session / rec["session_file"]
    copy.write_bytes(b"\0" * copy.stat().st_size)  # the session's copy damaged: replaced, never trusted
    code, out, err = run(["check", model, "--session", session], capsys)
    assert code == 0, out + err
    rec2 = json.loads((session / "session.json").read_text())["external_data"][0]
    assert rec2["stored_as"] == "copied" and rec2["sha256"] == rec["sha256"]
    from bisect_tui.core.external_data import file_digest

    assert file_digest(copy) == rec["sha256"]
    # other weights beside the same graph: another model (its digest covers the data file)
    data = model.parent / "w" / "mlp.weights"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(bytes(raw))
    code, out, err = run(["check", model, "--session", session], capsys)
    assert code == 2 and "another model" in err


def test_bisect_names_the_culprit_of_an_external_data_model(tmp_path, capsys, serialize_spy):
    model = save_external(gelu_mlp(), tmp_path / "user" / "mlp.onnx", "weights/mlp.weights")
    js = tmp_path / "bisect.json"
    code, out, err = run(["bisect", model, "--session", tmp_path / "s", "--json", js,
                          "--ort-config", "optimization.enable_gelu_approximation=1"], capsys)
    assert code == 1, out + err
    b = json.loads(js.read_text())["bisect"]
    assert b["verdict"] == "culprits"
    culprit = b["culprits"][0]
    assert culprit["op_type"] == "FastGelu" and culprit["original_nodes"] == GELU_NODES
    w = b["workaround"]
    # proven: the full engine rebuilt with the pass disabled passes tolerance
    assert w["kind"] == "disable_optimizers" and "GeluApproximation" in w["disabled_optimizers"]
    assert w["full_engine"]["passed"]
    big = [p for p in (tmp_path / "s").rglob("*.onnx") if p.stat().st_size > 100_000]
    assert not big, big
    # no build, mark or extraction of the search serialized the model with its weights
    # (a culprit's subgraph may hold its own small weights: never all 3 MB)
    assert serialize_spy and max(serialize_spy) < 3 * N * N * 4


def test_unregistered_external_data_is_one_error_not_a_runtime_message(tmp_path):
    from bisect_tui.core.errors import UserError
    from bisect_tui.core.external_data import base_of, load

    model = save_external(gelu_mlp(), tmp_path / "m" / "mlp.onnx", "x/unseen.weights")
    m = onnx.load(str(model), load_external_data=False)
    with pytest.raises(UserError, match="unseen.weights"):
        base_of(m)
    assert base_of(load(model)) == (tmp_path / "m").resolve()


def test_locations_outside_the_models_folder_are_refused(tmp_path):
    from bisect_tui.core.errors import UserError
    from bisect_tui.core.model import load_model_info

    model = save_external(gelu_mlp(), tmp_path / "m" / "mlp.onnx", "mlp.weights")
    (tmp_path / "secret.bin").write_bytes((tmp_path / "m" / "mlp.weights").read_bytes())
    m = onnx.load(str(model), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../secret.bin"
    model.write_bytes(m.SerializeToString())
    with pytest.raises(UserError, match="not a relative path inside the model"):
        load_model_info(model)


def test_derived_models_are_self_contained_when_small_and_linked_when_big(tmp_path, monkeypatch):
    """A culprit's subgraph (bundle.zip's copy must run anywhere) holds small weights;
    big ones stay in the data file, reached by a hard link, never copied."""
    import onnxruntime as ort

    from bisect_tui.core import external_data as ext

    model = save_external(gelu_mlp(), tmp_path / "m" / "mlp.onnx", "w/mlp.weights")
    m = ext.load(model)
    feeds = {"x": np.ones((4, N), np.float32)}
    want = ort.InferenceSession(str(model)).run(None, feeds)[0]
    small = tmp_path / "derived" / "small.onnx"
    ext.write_beside(m, small)
    assert not ext.has_external_data(onnx.load(str(small), load_external_data=False))
    np.testing.assert_array_equal(ort.InferenceSession(str(small)).run(None, feeds)[0], want)
    monkeypatch.setattr(ext, "INLINE_MAX_BYTES", 0)
    big = tmp_path / "derived" / "big.onnx"
    ext.write_beside(m, big)
    assert big.stat().st_size < 20_000
    linked = big.parent / "w" / "mlp.weights"
    assert os.path.samefile(linked, model.parent / "w" / "mlp.weights")  # the same inode: no copy
    np.testing.assert_array_equal(ort.InferenceSession(str(big)).run(None, feeds)[0], want)


def test_fp16_conversion_reads_the_weights_from_the_data_files(tmp_path, capsys):
    """The converter's input is read by our reader (onnx.load refuses the session's
    linked files), and its output keeps the weights outside as the source did."""
    from bisect_tui.core import external_data as ext

    model = save_external(gelu_mlp(), tmp_path / "user" / "mlp.onnx", "w/mlp.weights")
    js = tmp_path / "c.json"
    code, out, err = run(["check", model, "--precision", "fp16", "--session", tmp_path / "s", "--json", js], capsys)
    assert code in (0, 1), out + err
    d = json.loads(js.read_text())
    assert d["engine_error"] is None and d["outputs"]["y"]["metrics"]["max_abs"] > 0  # really ran in fp16
    converted = list((tmp_path / "s" / "engines").rglob("fp16_*.onnx"))
    assert converted and all(ext.has_external_data(onnx.load(str(p), load_external_data=False)) for p in converted)
