"""`bisect-tui compare GOLDEN TEST` on dumps made here: dtype alignment, pitfalls,
mapping files, bad input, and a real session baseline against ORT's fused outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

from bisect_tui.cli import main

from testlib import REPO

GELU = ["--ort-config", "optimization.enable_gelu_approximation=1"]


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bisect-tui: error: ")
    return lines[0]


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layer(x, w, dtype):
    """A small dense + GELU(tanh) layer computed entirely in `dtype`, like an engine would."""
    x, w = x.astype(dtype), w.astype(dtype)
    h = x @ w
    c = np.asarray(np.sqrt(2 / np.pi), dtype=dtype)
    return (np.asarray(0.5, dtype) * h * (np.asarray(1, dtype) + np.tanh(c * (h + np.asarray(0.044715, dtype) * h**3))))


@pytest.fixture
def dense(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    w = (rng.standard_normal((64, 32)) / 8).astype(np.float32)
    golden = layer(x, w, np.float32)
    fp16 = layer(x, w, np.float16)
    bf16 = layer(x, w, ml_dtypes.bfloat16).astype(ml_dtypes.bfloat16)
    np.save(tmp_path / "golden.npy", golden)
    return tmp_path, golden, fp16, bf16


def test_fp16_raw_dump_passes_after_alignment_where_naive_subtraction_fails(dense, capsys):
    d, golden, fp16, _ = dense
    np.save(d / "trt_output.npy", fp16.view(np.uint16))  # an FP16 binding buffer dumped as 16-bit words
    # the article's script: load both and subtract
    naive = np.abs(np.load(d / "golden.npy") - np.load(d / "trt_output.npy")).max()
    assert naive > 1e3
    code, out, _ = run(["compare", d / "golden.npy", d / "trt_output.npy", "--json", d / "r.json"], capsys)
    assert code == 0, out
    r = json.loads((d / "r.json").read_text())
    (t,) = r["tensors"]
    assert t["passed"] and t["tolerance"]["name"] == "fp16"
    assert 1e-4 < t["metrics"]["max_abs"] < 1e-2  # real fp16 rounding, far below the naive figure
    assert t["naive_max_abs"] == pytest.approx(float(naive))
    conv = t["conversions"][0]
    assert (conv["side"], conv["from_dtype"], conv["to_dtype"]) == ("test", "uint16", "float16")
    assert "chosen automatically" in conv["how"]
    assert "uint16 -> float16" in out and "naive |golden - test|" in out
    # forcing the wrong reading of the same words is caught by the tolerance
    code, out, _ = run(["compare", d / "golden.npy", d / "trt_output.npy", "--test-dtype", "trt_output=bf16"], capsys)
    assert code == 1 and "declared bf16" in out


def test_fp16_array_judged_by_its_own_preset(dense, capsys):
    d, golden, fp16, _ = dense
    np.save(d / "t.npy", fp16)
    code, out, _ = run(["compare", d / "golden.npy", d / "t.npy"], capsys)
    assert code == 0 and "tolerance fp16:" in out
    assert "golden float32, test float16 -> float64" in out
    code, out, _ = run(["compare", d / "golden.npy", d / "t.npy", "--preset", "fp32"], capsys)
    assert code == 1 and "FAIL" in out and "from --preset fp32" in out
    # an FP16 engine output the dumper already widened to float32 is still judged as FP16
    np.save(d / "t.npy", fp16.astype(np.float32))
    assert run(["compare", d / "golden.npy", d / "t.npy"], capsys)[0] == 1
    code, out, _ = run(["compare", d / "golden.npy", d / "t.npy", "--test-dtype", "t=fp16"], capsys)
    assert code == 0 and "tolerance fp16:" in out and "declared fp16, stored as float32" in out
    # output targets: a directory is bad input, an unwritable folder is the machine's fault (exit 5)
    code, _, err = run(["compare", d / "golden.npy", d / "t.npy", "--json", d], capsys)
    assert code == 2 and "is a directory" in one_line_error(err)
    code, _, err = run(["compare", d / "golden.npy", d / "t.npy", "--json", d / "golden.npy" / "r.json"], capsys)
    assert code == 2 and "is a file, not a folder" in one_line_error(err)
    ro = d / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    # root writes through the mode bits; /proc takes no new file from anyone
    unwritable = ro / "r.json" if not os.access(ro, os.W_OK) else Path("/proc/r.json")
    try:
        code, _, err = run(["compare", d / "golden.npy", d / "t.npy", "--json", unwritable], capsys)
        assert code == 5 and "cannot write" in one_line_error(err)
    finally:
        ro.chmod(0o700)


def test_bf16_raw_uint16_and_ml_dtypes_array(dense, capsys):
    d, golden, _, bf16 = dense
    np.save(d / "raw.npy", bf16.view(np.uint16))
    np.save(d / "mld.npy", bf16)  # np.save writes an ml_dtypes bfloat16 array as |V2
    assert np.load(d / "mld.npy").dtype.str == "|V2"
    for name, how in (("raw", "chosen automatically"), ("mld", "ml_dtypes bfloat16")):
        code, out, _ = run(["compare", d / "golden.npy", d / f"{name}.npy", "--json", d / f"{name}.json"], capsys)
        assert code == 0, out
        (t,) = json.loads((d / f"{name}.json").read_text())["tensors"]
        assert t["conversions"][0]["to_dtype"] == "bfloat16" and how in t["conversions"][0]["how"]
        assert t["tolerance"]["name"] == "bf16"
        assert 1e-3 < t["metrics"]["max_abs"] < 5e-2
    # declared explicitly: the same answer
    code, out, _ = run(["compare", d / "golden.npy", d / "raw.npy", "--test-dtype", "raw=bf16"], capsys)
    assert code == 0 and "read as bfloat16 bits (declared bf16)" in out
    # read as fp16 bits the same words are garbage: FAIL, not a pass by accident
    code, out, _ = run(["compare", d / "golden.npy", d / "raw.npy", "--test-dtype", "raw=fp16"], capsys)
    assert code == 1


def test_int8_needs_its_scale(dense, capsys):
    d, golden, _, _ = dense
    scale = float(np.abs(golden).max() / 127)
    q = np.clip(np.round(golden / scale), -127, 127).astype(np.int8)
    np.save(d / "q.npy", q)
    code, _, err = run(["compare", d / "golden.npy", d / "q.npy"], capsys)
    assert code == 2 and "--scale" in one_line_error(err)
    code, out, _ = run(["compare", d / "golden.npy", d / "q.npy", "--scale", f"q={scale!r}", "--json", d / "q.json"],
                       capsys)
    assert code == 0, out
    (t,) = json.loads((d / "q.json").read_text())["tensors"]
    assert t["tolerance"]["name"] == "int8" and "dequantized" in t["conversions"][0]["how"]
    assert t["metrics"]["max_abs"] <= scale / 2 + 1e-7


def test_int32_with_scale_and_fp64_golden(dense, capsys):
    d, golden, _, _ = dense
    np.save(d / "g64.npy", golden.astype(np.float64))
    scale = 1e-4
    np.save(d / "acc.npy", (np.round(golden.astype(np.float64) / scale) + 7).astype(np.int32))
    code, out, _ = run(["compare", d / "g64.npy", d / "acc.npy", "--scale", f"acc={scale}:7", "--json", d / "r.json"],
                       capsys)
    assert code == 0, out
    (t,) = json.loads((d / "r.json").read_text())["tensors"]
    assert t["conversions"][0]["how"] == "dequantized: (q - 7) * 0.0001"
    assert t["metrics"]["max_abs"] <= scale / 2 * (1 + 1e-6)
    # fp32 test against an fp64 golden: recorded, compared in float64
    np.save(d / "t32.npy", golden)
    code, out, _ = run(["compare", d / "g64.npy", d / "t32.npy"], capsys)
    assert code == 0 and "converted both: golden float64, test float32 -> float64" in out


def test_names_cannot_drive_the_terminal(tmp_path, capsys):
    a = np.ones((2, 3), np.float32)
    np.savez(tmp_path / "g.npz", **{"x\x1b[2J": a})
    np.savez(tmp_path / "t.npz", **{"x\x1b[2Jy": a})
    code, _, err = run(["compare", tmp_path / "g.npz", tmp_path / "t.npz"], capsys)
    assert code == 2 and "\x1b" not in err and "\\x1b[2J" in err
    np.savez(tmp_path / "t.npz", **{"x\x1b[2J": a + 1})
    code, out, _ = run(["compare", tmp_path / "g.npz", tmp_path / "t.npz", "--report", tmp_path / "r.md"], capsys)
    assert code == 1 and "\x1b" not in out and "[FAIL] x\\x1b[2J vs golden x\\x1b[2J" in out
    assert "\x1b" not in (tmp_path / "r.md").read_text()


def test_softmax_on_one_side_is_detected_and_fixed(tmp_path, capsys):
    logits = np.random.default_rng(1).standard_normal((4, 100)).astype(np.float32) * 3
    np.save(tmp_path / "golden.npy", softmax(logits))
    np.save(tmp_path / "engine.npy", logits)
    code, out, _ = run(["compare", tmp_path / "golden.npy", tmp_path / "engine.npy", "--json", tmp_path / "a.json"],
                       capsys)
    assert code == 1
    (t,) = json.loads((tmp_path / "a.json").read_text())["tensors"]
    (f,) = t["findings"]
    assert f["kind"] == "softmax" and "golden rows along axis -1 are probabilities" in f["text"]
    assert "matches golden to max |err|" in f["text"] and "--softmax -1" in f["fix"]
    assert "finding (softmax)" in out
    code, out, _ = run(["compare", tmp_path / "golden.npy", tmp_path / "engine.npy", "--softmax", "-1",
                        "--json", tmp_path / "b.json"], capsys)
    assert code == 0, out
    (t,) = json.loads((tmp_path / "b.json").read_text())["tensors"]
    hows = {c["side"]: c["how"] for c in t["conversions"]}
    assert "left as is" in hows["golden"] and "softmax along axis -1 applied" in hows["test"]
    assert t["metrics"]["max_abs"] < 1e-6


def test_swapped_batch_rows_are_detected_with_the_permutation(dense, capsys):
    d, golden, fp16, _ = dense
    perm = [2, 0, 1, 3, 4, 5, 7, 6]
    np.save(d / "t.npy", fp16[perm])  # the engine returned requests in another order
    code, out, _ = run(["compare", d / "golden.npy", d / "t.npy", "--json", d / "r.json"], capsys)
    assert code == 1
    (t,) = json.loads((d / "r.json").read_text())["tensors"]
    f = next(f for f in t["findings"] if f["kind"] == "batch_order")
    assert f["permutation"] == perm and f["axis"] == 0
    assert "permutation [2, 0, 1, 3, 4, 5, 7, 6] (test row i is golden row permutation[i]; 5 of 8 rows moved)" in out
    assert "put back in order, the tensor is within tolerance" in out
    # the fix works: the reordered dump passes
    back = np.empty_like(fp16)
    back[perm] = fp16[perm]
    np.save(d / "t.npy", back)
    assert run(["compare", d / "golden.npy", d / "t.npy"], capsys)[0] == 0


def test_logits_that_differ_by_value_but_rank_alike(tmp_path, capsys):
    logits = np.random.default_rng(5).standard_normal((6, 50)).astype(np.float32)
    np.savez(tmp_path / "golden.npz", logits=logits, hidden=logits)
    shifted = logits * 1.01 + 0.02  # a calibration shift: values off, ranking intact
    np.savez(tmp_path / "test.npz", logits=shifted, hidden=shifted)
    code, out, _ = run(["compare", tmp_path / "golden.npz", tmp_path / "test.npz", "--json", tmp_path / "r.json"],
                       capsys)
    assert code == 1 and "top-1 100.0%" in out
    found = {t["test"]: [f["kind"] for f in t["findings"]] for t in json.loads((tmp_path / "r.json").read_text())["tensors"]}
    # only a tensor that is a ranking gets the hint; for a hidden state an intact argmax means nothing
    assert found == {"logits": ["ranking"], "hidden": []}
    assert "--tol 'logits:atol=none,rtol=none,min_cosine=none,min_topk=0.995'" in out
    code, out, _ = run(["compare", tmp_path / "golden.npz", tmp_path / "test.npz", "--tol",
                        "*:atol=none,rtol=none,min_cosine=none,min_topk=0.995"], capsys)
    assert code == 0, out


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_mapping_file_with_globs(tmp_path, capsys, fmt):
    rng = np.random.default_rng(2)
    g = {f"decoder/{i}:0": rng.standard_normal((2, 8)).astype(np.float32) for i in range(3)}
    g["lm_head/logits:0"] = rng.standard_normal((2, 30)).astype(np.float32)
    np.savez(tmp_path / "golden.npz", **g)
    (tmp_path / "dumps").mkdir()
    for i in range(3):
        np.save(tmp_path / "dumps" / f"dec_{i}.npy", g[f"decoder/{i}:0"].astype(np.float16))
    np.save(tmp_path / "dumps" / "output_logits.npy",
            g["lm_head/logits:0"].astype(ml_dtypes.bfloat16).view(np.uint16))
    rules = {"dec_*": "decoder/*:0", "output_*": {"golden": "lm_head/*:0", "dtype": "bf16"}}
    if fmt == "yaml":
        mp = tmp_path / "map.yaml"
        mp.write_text('map:\n  "dec_*": "decoder/*:0"\n  "output_*":\n    golden: "lm_head/*:0"\n    dtype: bf16\n')
    else:
        mp = tmp_path / "map.json"
        mp.write_text(json.dumps(rules))
    code, out, _ = run(["compare", tmp_path / "golden.npz", tmp_path / "dumps", "--map", mp,
                        "--json", tmp_path / "r.json"], capsys)
    assert code == 0, out
    r = json.loads((tmp_path / "r.json").read_text())
    pairs = {t["test"]: (t["golden"], t["matched_by"]) for t in r["tensors"]}
    assert {k: v[0] for k, v in pairs.items()} == {
        "dec_0": "decoder/0:0", "dec_1": "decoder/1:0", "dec_2": "decoder/2:0", "output_logits": "lm_head/logits:0"}
    assert "mapping file rule 'dec_*'" in pairs["dec_1"][1]
    logits = next(t for t in r["tensors"] if t["test"] == "output_logits")
    assert "declared bf16" in logits["conversions"][0]["how"] and logits["tolerance"]["name"] == "bf16"


def test_mapping_rule_to_a_missing_golden_name(tmp_path, capsys):
    a = np.ones((2, 3), np.float32)
    np.savez(tmp_path / "golden.npz", **{"head/logits:0": a})
    np.savez(tmp_path / "test.npz", out=a)
    (tmp_path / "m.json").write_text(json.dumps({"out": "head/logit:0", "unused_*": "x"}))
    code, _, err = run(["compare", tmp_path / "golden.npz", tmp_path / "test.npz", "--map", tmp_path / "m.json"],
                       capsys)
    assert code == 2 and "'out -> head/logit:0' (did you mean 'head/logits:0'?)" in one_line_error(err)
    (tmp_path / "m.json").write_text(json.dumps({"out": "head/logits:0", "unused_*": "x"}))
    code, out, _ = run(["compare", tmp_path / "golden.npz", tmp_path / "test.npz", "--map", tmp_path / "m.json"],
                       capsys)
    assert code == 0 and "note: mapping file rule 'unused_*' matched no test tensor" in out


def test_unmatched_names_get_did_you_mean(tmp_path, capsys):
    a = np.ones((2, 3), np.float32)
    np.savez(tmp_path / "golden.npz", logits=a, hidden=a)
    np.savez(tmp_path / "test.npz", logit=a, hidden=a)
    code, _, err = run(["compare", tmp_path / "golden.npz", tmp_path / "test.npz"], capsys)
    assert code == 2
    line = one_line_error(err)
    assert "'logit' (did you mean 'logits'?)" in line and "--map" in line
    code, out, _ = run(["compare", tmp_path / "golden.npz", tmp_path / "test.npz", "--skip-unmatched"], capsys)
    assert code == 0 and "skipped test tensor 'logit' (did you mean 'logits'?)" in out


def test_bad_inputs_give_one_line_and_exit_2(tmp_path, capsys):
    g = np.zeros((2, 10), np.float32)
    np.save(tmp_path / "golden.npy", g)
    # missing file
    code, _, err = run(["compare", tmp_path / "golden.npy", tmp_path / "missing.npy"], capsys)
    assert code == 2 and "missing.npy does not exist" in one_line_error(err)
    # a pickled object array is refused, not unpickled
    np.save(tmp_path / "pickled.npy", np.array([{"x": 1}, None], dtype=object), allow_pickle=True)
    code, _, err = run(["compare", tmp_path / "golden.npy", tmp_path / "pickled.npy"], capsys)
    assert code == 2 and "allow_pickle=False" in one_line_error(err)
    np.savez(tmp_path / "pickled.npz", out=np.array([object()], dtype=object))
    code, _, err = run(["compare", tmp_path / "golden.npy", tmp_path / "pickled.npz"], capsys)
    assert code == 2 and "object array" in one_line_error(err)
    # an extra beam dimension
    np.save(tmp_path / "beams.npy", np.zeros((2, 4, 10), np.float32))
    code, _, err = run(["compare", tmp_path / "golden.npy", tmp_path / "beams.npy"], capsys)
    line = one_line_error(err)
    assert code == 2 and "GOLDEN (2, 10) vs TEST (2, 4, 10)" in line
    assert "extra dimension of size 4 at axis 1" in line
    # a transposed layout, and a different batch size
    np.save(tmp_path / "tr.npy", np.zeros((10, 2), np.float32))
    code, _, err = run(["compare", tmp_path / "golden.npy", tmp_path / "tr.npy"], capsys)
    assert code == 2 and "transposed layout" in one_line_error(err)
    np.save(tmp_path / "b3.npy", np.zeros((3, 10), np.float32))
    code, _, err = run(["compare", tmp_path / "golden.npy", tmp_path / "b3.npy"], capsys)
    assert code == 2 and "axis 0 is 2 in GOLDEN and 3 in TEST" in one_line_error(err)
    # a dropped size-1 dim is the same tensor
    np.save(tmp_path / "sq.npy", np.zeros((1, 2, 10), np.float32))
    assert run(["compare", tmp_path / "golden.npy", tmp_path / "sq.npy"], capsys)[0] == 0
    # a bad mapping file
    (tmp_path / "m.yaml").write_text("a: [unclosed\n")
    code, _, err = run(["compare", tmp_path / "golden.npy", tmp_path / "sq.npy", "--map", tmp_path / "m.yaml"], capsys)
    assert code == 2 and "not valid YAML" in one_line_error(err)


def test_one_line_through_the_real_entry_point(tmp_path):
    out = subprocess.run([sys.executable, "-m", "bisect_tui", "compare", str(tmp_path / "a.npy"),
                          str(tmp_path / "b.npy")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0 and "GOLDEN" in out.stderr and "does not exist" in out.stderr


def test_report_overlays_histograms_and_escapes_names(tmp_path, capsys):
    rng = np.random.default_rng(4)
    g = rng.standard_normal((3, 40)).astype(np.float32)
    name = "evil|name*[x](javascript:alert)"
    np.savez(tmp_path / "golden.npz", **{name: g})
    np.savez(tmp_path / "test.npz", **{name: g + 0.5})
    code, out, _ = run(["compare", tmp_path / "golden.npz", tmp_path / "test.npz",
                        "--report", tmp_path / "out" / "report.md"], capsys)
    assert code == 1
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| evil\\|name\\*\\[x\\](javascript:alert) |" in md  # the table cell stays one cell
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    links = [c.attrs.get("href") or c.attrs.get("src") for t in tokens for c in (t.children or [])
             if c.type in ("link_open", "image")]
    assert links and all(not str(h).startswith("javascript") for h in links), links
    pngs = list((tmp_path / "out" / "report-plots").glob("*.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"](report-plots/{pngs[0].name})" in md and "golden and test values overlaid" in md
    # the histograms drawn are the comparison's own: the shift shows as two bumps
    r = main(["compare", str(tmp_path / "golden.npz"), str(tmp_path / "test.npz"), "-q", "--json",
              str(tmp_path / "r.json")])
    assert r == 1
    m = json.loads((tmp_path / "r.json").read_text())["tensors"][0]["metrics"]
    assert sum(m["ref_hist"]["counts"]) == sum(m["test_hist"]["counts"]) == g.size
    assert m["ref_hist"]["counts"] != m["test_hist"]["counts"]


def _ort_dump(session: Path, out_dir: Path, config: dict) -> str:
    """Run the session's model with ORT at the fused level on the session's exact inputs
    and np.save each output under a file-safe name, as an external harness would."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    sess = ort.InferenceSession(str(session / "model.onnx"), so, providers=["CPUExecutionProvider"])
    with np.load(session / "input.npz", allow_pickle=False) as z:
        feeds = {k: z[k][0] for k in z.files}
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [o.name for o in sess.get_outputs()]
    for name, value in zip(names, sess.run(None, feeds)):
        np.save(out_dir / (name.replace("/", "_").replace(":", "_") + ".npy"), value)
    return names[0]


@pytest.mark.slow
def test_session_baseline_is_golden_for_ort_fused_outputs(samples, tmp_path, capsys):
    model = samples / "transformer_block.onnx"
    sess = tmp_path / "s"
    code, _, _ = run(["check", model, "--session", sess, *GELU, "--json", tmp_path / "check.json", "-q"], capsys)
    assert code == 1
    check = json.loads((tmp_path / "check.json").read_text())

    name = _ort_dump(sess, tmp_path / "fused", {})
    code, out, _ = run(["compare", sess, tmp_path / "fused", "--json", tmp_path / "ok.json"], capsys)
    assert code == 0, out
    ok = json.loads((tmp_path / "ok.json").read_text())
    assert ok["golden"]["kind"] == "session"
    (t,) = ok["tensors"]
    assert t["golden"] == name == "mlp/residual:0" and t["matched_by"] == "same file-safe name"
    assert 0 < t["metrics"]["max_abs"] < 1e-4  # fused kernels reorder arithmetic: tiny, nonzero
    assert "each matching its manifest SHA-256" in out

    _ort_dump(sess, tmp_path / "gelu", {"optimization.enable_gelu_approximation": "1"})
    code, out, _ = run(["compare", sess / "baseline", tmp_path / "gelu", "--json", tmp_path / "bad.json"], capsys)
    assert code == 1
    (t,) = json.loads((tmp_path / "bad.json").read_text())["tensors"]
    # the same numbers `check` measured on the same engine setting
    assert t["metrics"]["max_abs"] == pytest.approx(check["outputs"][name]["metrics"]["max_abs"], rel=1e-6)
    assert t["verdict"]["failed"] == check["outputs"][name]["verdict"]["failed"]

    # a baseline file changed after the dump is not trusted
    f = next((sess / "baseline").glob("layer_*_mlp_residual_0.npy"))
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    code, _, err = run(["compare", sess, tmp_path / "fused"], capsys)
    assert code == 2 and "does not match the SHA-256 in its manifest" in one_line_error(err)

    # a manifest that points outside the baseline folder (or through a symlink) is refused
    mpath = sess / "baseline" / "manifest.json"
    manifest = json.loads(mpath.read_text())
    entry = next(e for e in manifest["tensors"] if e["tensor"] == name)
    (tmp_path / "elsewhere.npy").write_bytes(f.read_bytes())
    for target in ("../../elsewhere.npy", "link.npy"):
        if target == "link.npy":
            (sess / "baseline" / "link.npy").symlink_to(tmp_path / "elsewhere.npy")
        entry["file"] = target
        mpath.write_text(json.dumps(manifest))
        code, _, err = run(["compare", sess, tmp_path / "fused"], capsys)
        assert code == 2 and "points outside the baseline folder; refused" in one_line_error(err)


def test_ci_snippets_in_the_docs_run_and_upload_what_compare_writes(tmp_path, monkeypatch, capsys):
    import re
    import shlex

    import yaml

    text = (REPO / "docs" / "compare.md").read_text()
    docs = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    github = next(d for d in docs if "jobs" in d)
    gitlab = next(d for d in docs if "accuracy" in d)["accuracy"]
    steps = github["jobs"]["compare"]["steps"]
    gh_line = next(s["run"] for s in steps if "bisect-tui compare" in s.get("run", ""))
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and gitlab["artifacts"]["when"] == "always"
    gl_line = next(line for line in gitlab["script"] if "bisect-tui compare" in line)
    assert gl_line == gh_line

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((2, 20)).astype(np.float32)
    Path("golden").mkdir()
    Path("dumps").mkdir()
    np.save("golden/logits.npy", logits)
    np.save("dumps/output_0.npy", logits.astype(np.float16))
    Path("names.yaml").write_text("output_0: logits\n")
    argv = shlex.split(gh_line)
    assert argv[0] == "bisect-tui"
    assert main(argv[1:]) == 0
    for p in gitlab["artifacts"]["paths"]:
        assert Path(p).exists(), p
    assert upload["with"]["path"].split() == gitlab["artifacts"]["paths"]
    assert list(Path("compare-plots").glob("*.png"))
    np.save("dumps/output_0.npy", (logits + 0.1).astype(np.float16))
    assert main(argv[1:]) == 1  # a non-zero exit fails the job
    assert json.loads(Path("compare.json").read_text())["verdict"] == "fail"
