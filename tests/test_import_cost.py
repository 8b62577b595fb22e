"""What an ONNX Runtime `check` imports, in a fresh interpreter.

Importing is a large share of a small model's check (issue 20: 129 of our
modules and twice the dataclasses of the code before). These tests keep the
modules of other paths out: no Textual, no other engine's library, of the other
engines only their declarations (the CLI's flags and `--help` need those), and
for the determinism check's second interpreter not the engine contract, the
registry or an engine's declarations at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import helper

from testlib import REPO, make_model, vi

DRIVER = """
import json, sys
from bisect_tui.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""

SECOND_RUN = """
import json, sys
from bisect_tui.core.second_run import main
code = main(["--stdin", "bisect_tui.engines.ort.unfused:OrtUnfused"])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _modules(code: str, args: list[str], cwd, stdin: str = "") -> set[str]:
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, input=stdin, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["code"] == 0, out.stderr[-2000:]
    return set(doc["modules"])


def test_an_ort_check_imports_no_other_engine_and_no_textual(tmp_path):
    m = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [1, 4])], [vi("y", [1, 4])], [])
    onnx.save(m, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    mods = _modules(DRIVER, ["check", "m.onnx", "--input", "x.npy", "--session", "s", "--no-determinism",
                             "--no-arbiter", "-q"], tmp_path)
    assert "bisect_tui.engines.ort.engine" in mods and "onnxruntime" in mods  # the check really ran
    assert not {m for m in mods if m.split(".")[0] in ("textual", "tensorrt", "openvino", "polygraphy")}
    assert not {m for m in mods if m.startswith("bisect_tui.tui")}
    # ONNX Runtime's optimizer log (a bisection's) and FP16 converter (an fp16 run's)
    assert not {"bisect_tui.engines.ort.passlog", "bisect_tui.engines.ort.fp16"} & mods
    # contract records a check never makes: a search's Switch, a bundle's ReproSpec
    assert not {"bisect_tui.api.switch", "bisect_tui.api.repro"} & mods
    for other in ("openvino", "tensorrt"):
        pkg = f"bisect_tui.engines.{other}"
        assert {m for m in mods if m.startswith(pkg + ".")} <= {pkg + ".declare"}, other


def test_the_second_interpreter_imports_no_engine_contract_registry_or_declaration(tmp_path):
    mods = _modules(SECOND_RUN, [], tmp_path, stdin="\n")  # no plan: it stops after the imports
    assert "bisect_tui.engines.ort.unfused" in mods and "bisect_tui.core.groups" in mods
    assert not {"bisect_tui.api.engine", "bisect_tui.api.config", "bisect_tui.api.graph",
                "bisect_tui.engines.registry", "bisect_tui.engines.ort.declare"} & mods
