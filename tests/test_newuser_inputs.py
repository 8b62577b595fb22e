"""What a new user hits first on a real model: dynamic dims, config inputs
(a sample rate), fixed values, integer inputs, and the engine's own log lines."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from bisect_tui.cli import main
from bisect_tui.core.errors import UserError
from bisect_tui.core.input_suggest import InputsNeedValues, dynamic_dims, resolve_shapes
from bisect_tui.core.inputs import generate_inputs, parse_input_values, parse_shapes
from bisect_tui.core.model import load_model_info
from bisect_tui.engines.ort.unfused import OrtUnfused

from newuser_models import rows_by_input, text_line_image, vad_like
from testlib import REPO


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_one_error_names_every_dynamic_dim_and_suggests_what_ran(tmp_path):
    info = load_model_info(vad_like(tmp_path / "vad.onnx"))
    with pytest.raises(InputsNeedValues) as e:
        resolve_shapes(info, {}, reference=OrtUnfused())
    msg = str(e.value)
    assert "\n" not in msg
    # every input and dim at once, not one per run
    assert "3 dynamic dims" in msg
    for part in ("'input'", "axis 0 'batch'", "axis 1 'sequence'", "'state'", "'sr'"):
        assert part in msg, part
    # a suggestion from the dims' names and the sample-rate input, checked by a probe
    sug = e.value.suggestion
    assert sug.shapes == {"input": [1, 512], "state": [2, 1, 4]} and sug.values == {"sr": 16000}
    assert sug.probe == "ran"
    assert "--shape input=1x512 --shape state=2x1x4 --input-value sr=16000" in msg
    assert "it ran in a quick probe on ONNX Runtime" in msg


def test_the_suggested_flags_run_end_to_end(tmp_path, capsys):
    model = vad_like(tmp_path / "vad.onnx")
    code, _, err = run(["check", model, "-q"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    flags = err.split("Try: ", 1)[1].split(" (", 1)[0].split()
    code, out, err = run(["check", model, *flags, "--input-value", "flag=true", "--session", tmp_path / "s",
                          "--json", tmp_path / "r.json", "-q"], capsys)
    assert code == 0, err
    r = json.loads((tmp_path / "r.json").read_text())
    arrays = {a["name"]: a for a in r["inputs"]["arrays"]}
    assert arrays["sr"]["values"] == [16000] and "fixed value 16000" in arrays["sr"]["how"]
    assert arrays["flag"]["values"] == [True]
    assert arrays["input"]["shape"] == [1, 512] and arrays["state"]["shape"] == [2, 1, 4]


def test_placeholder_dims_are_unnamed_and_the_probe_tries_a_text_line(tmp_path):
    info = load_model_info(text_line_image(tmp_path / "rec.onnx"))
    dims = dynamic_dims(info, {})
    assert [(d.axis, d.name) for d in dims] == [(0, None), (2, None), (3, None)]  # '?' names nothing
    with pytest.raises(UserError, match="neither an input"):
        resolve_shapes(info, parse_shapes(["?=48"]))
    with pytest.raises(InputsNeedValues) as e:
        resolve_shapes(info, {}, reference=OrtUnfused())
    # 224x224 does not fit the head; the probe's next guess (a 48x320 text line) does
    assert e.value.suggestion.shapes == {"x": [1, 3, 48, 320]} and e.value.suggestion.probe == "ran"
    assert "?x3x?x?" in str(e.value) and "--shape x=1x3x48x320" in str(e.value)
    assert "the first guess did not run" in str(e.value)


def test_input_values_fill_and_are_checked(tmp_path):
    info = load_model_info(vad_like(tmp_path / "vad.onnx"))
    vals = parse_input_values(["sr=16000", "flag=false"])
    assert vals == {"sr": 16000, "flag": False}
    shapes = resolve_shapes(info, parse_shapes(["batch=1", "sequence=8"]), vals)
    a = generate_inputs(info, shapes, values=vals, samples=2)
    assert a.arrays["sr"].dtype == np.int64 and a.arrays["sr"].shape == (2,) and (a.arrays["sr"] == 16000).all()
    assert a.arrays["flag"].dtype == bool and not a.arrays["flag"].any()
    with pytest.raises(UserError, match="give an integer"):
        generate_inputs(info, shapes, values={"sr": 16000.5, "flag": True})
    with pytest.raises(UserError, match="give true or false"):
        generate_inputs(info, shapes, values={"sr": 16000, "flag": 3})
    with pytest.raises(UserError, match="unknown input"):
        generate_inputs(info, shapes, values={"rate": 1})
    with pytest.raises(UserError, match="both --input-value and --input-range"):
        generate_inputs(info, shapes, value_ranges={"sr": (0, 5)}, values={"sr": 1})
    with pytest.raises(UserError, match="expected NAME=VALUE"):
        parse_input_values(["sr"])
    with pytest.raises(UserError, match="not a number"):
        parse_input_values(["sr=fast"])


def test_a_sample_rate_is_never_guessed(tmp_path, capsys):
    model = vad_like(tmp_path / "vad.onnx")
    code, _, err = run(["check", model, "--shape", "batch=1", "--shape", "sequence=8", "-q"], capsys)
    assert code == 2
    assert "'sr'" in err and "looks like a sample rate" in err and "--input-value sr=16000" in err


def test_random_integers_that_break_the_run_are_named_and_ort_logs_stay_out(tmp_path):
    model = rows_by_input(tmp_path / "rows.onnx")
    sess = tmp_path / "s"
    out = subprocess.run([sys.executable, "-m", "bisect_tui", "check", str(model), "--session", str(sess), "-q"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # ORT's own coloured [E:onnxruntime...] lines do not print
    assert "onnxruntime:" not in out.stderr.split("error:", 1)[0]
    assert "the values of 'rows' were random guesses" in lines[0]
    assert "--input-value rows=VALUE" in lines[0] and "engine.log" in lines[0]
    log = (sess / "engine.log").read_text()
    assert "Gather" in log and "pick" in log  # the engine's whole message is kept in the session
    # with a real value it runs; the failed first attempt does not lock the directory
    ok = subprocess.run([sys.executable, "-m", "bisect_tui", "check", str(model), "--session", str(sess),
                         "--input-value", "rows=1", "-q"], capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
