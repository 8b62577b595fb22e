"""OpenVINO failures keep their cause, and 0-d inputs stay 0-d.

A model ORT runs but OpenVINO's ONNX front end cannot convert (an If whose
branches give tensors of different rank, read by a Conv: "The input data
tensor's rank has to be known (static)", the failure of Silero VAD) must be
reported as an engine that could not be built, with OpenVINO's whole message
in the terminal's pointer, check.json, a session file and report.md. Silero's
`sr` input is a scalar: it must reach the engine as shape [], not [1]."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ov = pytest.importorskip("openvino")

from bisect_tui.cli import main  # noqa: E402
from testlib import init, make_model, vi  # noqa: E402


def untyped_rank(name: str) -> onnx.ValueInfoProto:
    v = onnx.ValueInfoProto()
    v.name = name
    v.type.tensor_type.elem_type = TensorProto.FLOAT
    return v


def rank_changing_if(path: Path) -> Path:
    """If(flag > 0) gives x [1,1,8] (then) or Unsqueeze(x) [1,1,1,8] (else), then a Conv:
    ORT runs the then branch; OpenVINO cannot convert a Conv of unknown rank."""
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t_out"], name="then_id")], "then", [],
                               [untyped_rank("t_out")])
    else_g = helper.make_graph([helper.make_node("Unsqueeze", ["x", "ax"], ["e_out"], name="else_unsq")],
                               "else", [], [untyped_rank("e_out")])
    nodes = [helper.make_node("Greater", ["flag", "zero"], ["cond"], name="gt"),
             helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
             helper.make_node("Conv", ["y", "W"], ["z"], name="conv", pads=[1, 1])]
    inits = [init("W", np.ones((2, 1, 3), np.float32)), init("zero", np.float32(0)),
             init("ax", np.array([0], np.int64))]
    m = make_model(nodes, [vi("x", [1, 1, 8]), vi("flag", [])], [vi("z", [1, 2, 8])], inits)
    onnx.save(m, str(path))
    return path


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_build_failure_keeps_openvinos_whole_message(tmp_path, capsys):
    model = rank_changing_if(tmp_path / "rank_if.onnx")
    session, js, report = tmp_path / "s", tmp_path / "check.json", tmp_path / "report.md"
    code, out, err = run(["check", model, "--engine", "openvino", "--input-value", "flag=1", "--session", session,
                          "--json", js, "--report", report], capsys)
    # docs/check.md: an engine that cannot be built is a finding, exit 1, never "bad input" (2)
    assert code == 1, out + err
    assert "FAIL: the fused engine could not be built" in out and "breaks tolerance" not in out
    # the short line names the failed op and its cause, not only "failed with OpConversionFailure:"
    short = next(line for line in out.splitlines() if line.startswith("fused engine failed to build"))
    assert "Conv-17" in short and "rank has to be known (static)" in short
    d = json.loads(js.read_text())
    e = d["engine_error"]
    assert d["verdict"] == "fail" and d["exit_code"] == 1 and e["kind"] == "build_error"
    assert "Model wasn't fully converted" in e["detail"] and "Conversion is failed for: Conv-17" in e["detail"]
    assert "The input data tensor's rank has to be known (static)" in e["detail"]
    assert e["detail_file"] in out  # the terminal says where the whole text is
    assert (session / e["detail_file"]).read_text().strip() == e["detail"].strip()
    md = report.read_text()
    assert md.startswith("# bisect-tui check: FAIL: the fused engine could not be built")
    assert "breaks tolerance" not in md
    assert "```\n" in md and "The input data tensor's rank has to be known (static)" in md
    assert "| output |" not in md  # no empty outputs table for an engine that never ran


def test_the_whole_message_is_bounded_and_escaped(tmp_path):
    from bisect_tui.api import EngineBuildError
    from bisect_tui.core.report.mdtools import fenced

    e = EngineBuildError("x", "short", "line\x1b[31m red\n" + "y" * 20000)
    assert len(e.detail) == EngineBuildError.DETAIL_MAX
    assert "\x1b" not in "\n".join(fenced(e.detail.splitlines()))


def scalar_model(path: Path) -> Path:
    """y = x * s with `s` 0-d, and s itself as an output: a rank-1 `s` shows in its shape."""
    nodes = [helper.make_node("Mul", ["x", "s"], ["y"], name="scale"),
             helper.make_node("Identity", ["s"], ["s_out"], name="pass_s")]
    m = make_model(nodes, [vi("x", [2, 3]), vi("s", [])], [vi("y", [2, 3]), vi("s_out", [])])
    onnx.save(m, str(path))
    return path


def test_a_0d_input_reaches_openvino_as_0d(tmp_path, capsys):
    from bisect_tui.engines import EngineConfig, get_engine

    model = scalar_model(tmp_path / "scalar.onnx")
    built = get_engine("openvino").build(model, EngineConfig(), ())
    try:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        out = built.run({"x": x, "s": np.asarray(np.float32(3.0))})
    finally:
        built.close()
    assert out["s_out"].shape == () and out["s_out"] == 3.0
    np.testing.assert_array_equal(out["y"], x * 3)
    code, o, e = run(["check", model, "--engine", "openvino", "--input-value", "s=16000",
                      "--session", tmp_path / "s"], capsys)
    assert code == 0, o + e
