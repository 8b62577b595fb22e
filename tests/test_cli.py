"""The headless CLI: exit codes, one-line errors, JSON contract, nothing lost on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from bisect_tui.cli import main

from testlib import OLD_ORT_FUSIONS, REPO, culprit_matches, make_model, vi

GELU = ["--ort-config", "optimization.enable_gelu_approximation=1"]


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def snapshot(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}


def test_help_is_fast_and_lists_exit_codes():
    out = subprocess.run([sys.executable, "-m", "bisect_tui", "check", "--help"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0
    assert "3 baseline not deterministic" in out.stdout and "--ort-config" in out.stdout


def test_check_passes_then_fails_with_gelu_approximation(samples, tmp_path, capsys):
    model = samples / "transformer_block.onnx"
    sess = tmp_path / "s"
    code, out, _ = run(["check", model, "--session", sess, "--json", tmp_path / "ok.json", "-q"], capsys)
    assert code == 0, out
    ok = json.loads((tmp_path / "ok.json").read_text())
    assert ok["verdict"] == "pass" and ok["exit_code"] == 0
    (name, o), = ok["outputs"].items()
    assert o["passed"] and o["metrics"]["max_abs"] < 1e-5
    assert ok["determinism"]["deterministic"] is True
    assert {"verdict", "outputs", "determinism", "range_check", "fused_nodes", "versions"} <= set(ok)
    ops = {n["op_type"] for n in ok["fused_nodes"]}
    gelu_op = "BiasGelu" if OLD_ORT_FUSIONS else "Gelu"
    assert {gelu_op, "SkipLayerNormalization"} <= ops
    gelu = next(n for n in ok["fused_nodes"] if n["op_type"] == gelu_op)
    assert culprit_matches(gelu["original_nodes"], ["mlp/gelu/div", "mlp/gelu/erf", "mlp/gelu/add_one",
                                                    "mlp/gelu/mul_x", "mlp/gelu/mul_half"])

    code, out, _ = run(["check", model, "--session", sess, *GELU, "--json", tmp_path / "bad.json",
                        "--report", tmp_path / "bad.md", "-q"], capsys)
    assert code == 1
    bad = json.loads((tmp_path / "bad.json").read_text())
    assert bad["verdict"] == "fail" and bad["failing_outputs"] == [name]
    failed = bad["outputs"][name]["verdict"]["failed"]
    assert "atol/rtol" in failed
    assert 1e-3 < bad["outputs"][name]["metrics"]["max_abs"] < 1e-2
    assert "FAIL" in out and "atol/rtol" in out
    md = (tmp_path / "bad.md").read_text()
    assert "| " + name in md and "FAIL" in md
    # inside the fused graph, the first tensor out of tolerance is the FastGelu's output
    assert bad["shared_tensors"]["first_failing_tensor"] == "mlp/gelu/mul_half:0"
    assert "made by fused FastGelu" in out
    png = sess / "plots" / "mlp_residual_0.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the plots travel next to the report (bad-plots/), referenced by their file names
    assert "](bad-plots/mlp_residual_0.png)" in md and "](bad-plots/error-along-graph.png)" in md
    assert (tmp_path / "bad-plots" / "error-along-graph.png").read_bytes()[:4] == b"\x89PNG"
    assert str(tmp_path) not in md  # no local absolute path in a report meant for a bug tracker
    assert bad["baseline"]["reused"] is True  # the second check reused the dump


def test_presets_decide_the_verdict(samples, tmp_path, capsys):
    model = samples / "transformer_block.onnx"
    # the same gelu error passes the looser 'article' preset (MAE < 1e-3, rel < 1%, cos > 0.99)
    code, out, _ = run(["check", model, "--session", tmp_path / "s", *GELU, "--preset", "article", "-q"], capsys)
    assert code == 0, out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["check", "{tmp}/missing.onnx"], "model file not found"),
        (["check", "{tmp}/text.onnx"], "not an ONNX model"),
        (["check", "{tmp}/dyn.onnx"], "axis 0 'batch'"),
        (["check", "{model}", "--input", "{tmp}/wrong_dtype.npy"], "is float64, the model expects float32"),
        (["check", "{model}", "--input", "{tmp}/wrong_shape.npy"], "the model expects 1x16x64"),
        (["check", "{model}", "--disable", "GeluAproximation"], "did you mean GeluApproximation"),
        (["check", "{model}", "--preset", "fp33"], "unknown tolerance preset"),
        (["check", "{model}", "--ort-config", "novalue"], "expected KEY=VALUE"),
        (["check", "{model}", "--max-memory", "lots"], "bad memory size"),
    ],
)
def test_bad_input_one_line_exit_2_and_session_untouched(samples, tmp_path, capsys, argv, message):
    model = samples / "transformer_block.onnx"
    (tmp_path / "text.onnx").write_text("definitely not onnx")
    onnx.save(make_model([onnx.helper.make_node("Relu", ["x"], ["y"], name="r")],
                         [vi("x", ["batch", 4])], [vi("y", ["batch", 4])]), tmp_path / "dyn.onnx")
    np.save(tmp_path / "wrong_dtype.npy", np.zeros((1, 16, 64)))
    np.save(tmp_path / "wrong_shape.npy", np.zeros((1, 16, 32), np.float32))
    sess = tmp_path / "session"
    assert run(["check", model, "--session", sess, "-q"], capsys)[0] == 0
    before = snapshot(sess)
    argv = [a.format(tmp=tmp_path, model=model) for a in argv]
    code, out, err = run([*argv, "--session", sess, "-q"], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err + out
    after = snapshot(sess)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing lost or rewritten


def test_bad_input_has_no_traceback_in_a_real_process(tmp_path):
    (tmp_path / "x.onnx").write_bytes(b"\x00\x01garbage")
    out = subprocess.run([sys.executable, "-m", "bisect_tui", "check", str(tmp_path / "x.onnx")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1].startswith("bisect-tui: error: not an ONNX model")
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "bisect-sessions").exists()


def test_closed_output_is_not_an_internal_error_and_the_session_resumes(samples, tmp_path):
    """`bisect-tui check ... | head`: the reader goes away and the next write raises
    BrokenPipeError. That is the user's pipe, not a bug: exit 141 (128 + SIGPIPE), one
    line, no crash log, and the rerun reuses what was done."""
    sess = tmp_path / "s"
    argv = [sys.executable, "-m", "bisect_tui", "check", str(samples / "transformer_block.onnx"),
            "--session", str(sess)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    p.stdout.close()  # the reader exits before the first line
    with p.stderr:
        err = p.stderr.read()
    assert p.wait(timeout=300) == 141, err
    assert err.strip().splitlines()[-1].startswith("bisect-tui: the output was closed"), err
    assert "Traceback" not in err and "internal error" not in err
    assert not (sess / "log").exists() or not list((sess / "log").glob("crash-*"))
    assert (sess / "baseline").is_dir()
    again = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "(reused)" in again.stdout


def test_a_broken_pipe_of_our_own_is_still_an_internal_error(tmp_path, capsys, monkeypatch):
    """A BrokenPipeError while our stdout is fine (a worker's pipe, the second run's) is a bug."""
    from bisect_tui import commands

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(commands, "cmd_sessions", broken)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    code = main(["sessions"])
    err = capsys.readouterr().err
    assert code == 70 and "internal error (BrokenPipeError" in err, err


def test_output_closed_reads_the_pipe_itself(monkeypatch):
    """Only a stdout whose reader has gone counts as closed; an open pipe does not."""
    import os

    from bisect_tui.cli import _closed_streams

    r, w = os.pipe()
    with os.fdopen(w, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert out not in _closed_streams()
        os.close(r)
        assert out in _closed_streams()


def test_closed_stderr_counts_as_closed_output(samples, tmp_path):
    """`2>&1 | head` closes both; `2>(head -1)` closes only stderr, where the progress goes."""
    argv = [sys.executable, "-m", "bisect_tui", "check", str(samples / "transformer_block.onnx"),
            "--session", str(tmp_path / "s")]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    p.stderr.close()
    with p.stdout:
        out = p.stdout.read()
    assert p.wait(timeout=300) == 141, out
    assert b"Traceback" not in out
    assert not list((tmp_path / "s").glob("log/crash-*"))


def test_nan_in_baseline_exits_4(tmp_path, capsys):
    nodes = [onnx.helper.make_node("Log", ["x"], ["y"], name="log")]
    p = tmp_path / "log.onnx"
    onnx.save(make_model(nodes, [vi("x", [64])], [vi("y", [64])]), p)  # log of negative normals
    code, out, _ = run(["check", p, "--session", tmp_path / "s", "-q"], capsys)
    assert code == 4
    assert "NaN/Inf" in out and "log" in out


def test_other_session_model_is_refused(samples, tmp_path, capsys):
    sess = tmp_path / "s"
    assert run(["check", samples / "cnn.onnx", "--session", sess, "-q"], capsys)[0] == 0
    code, _, err = run(["check", samples / "transformer_block.onnx", "--session", sess, "-q"], capsys)
    assert code == 2 and "another model" in err


def test_tui_command_rejects_a_bad_model_before_opening(tmp_path, capsys):
    code, out, err = run(["tui", tmp_path / "missing.onnx"], capsys)
    assert code == 2 and err.strip() == f"bisect-tui: error: model file not found: {tmp_path / 'missing.onnx'}"
