"""Shared fixtures: sample models built once per test run, tiny models built
with onnx.helper, and an isolated state dir so tests never touch $HOME."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from testlib import REPO, init, make_model, vi  # noqa: F401  (re-exported for fixtures)

from bisect_tui.engine_choice import install_registry

install_registry()  # the registry's engines for the triages tests make without injecting one


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(scope="session")
def samples(tmp_path_factory) -> Path:
    """sample_models/*.onnx built fresh by the repo's own script."""
    out = tmp_path_factory.mktemp("samples")
    subprocess.run([sys.executable, str(REPO / "sample_models" / "build.py"), "--out", str(out), "-q"],
                   check=True)
    return out


@pytest.fixture(scope="session")
def cases(samples) -> dict:
    data = json.loads((samples / "cases.json").read_text())
    return {Path(c["model"]).stem: c for c in data["cases"]}


@pytest.fixture(scope="session")
def ln_stack_300(tmp_path_factory):
    """(model, path) of the 300-node two-culprit LayerNorm stack of bench/scale_models.py:
    big enough to cut into parts once a test lowers parts.PART_NODES."""
    sys.path.insert(0, str(REPO / "bench"))
    from scale_models import two_culprit_stack

    model, _ = two_culprit_stack(20, 12)
    path = tmp_path_factory.mktemp("ln_stack") / "ln0_300.onnx"
    onnx.save(model, str(path))
    return model, path


@pytest.fixture
def tiny_model(tmp_path) -> Path:
    """x[2,8] -> MatMul -> Relu -> Mul(b,b) -> y ; weights scaled to overflow fp16 at y."""
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32) * 300
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Mul", ["b", "b"], ["y"], name="square"),
    ]
    m = make_model(nodes, [vi("x", [2, 8])], [vi("y", [2, 8])], [init("w", w)])
    p = tmp_path / "tiny.onnx"
    onnx.save(m, p)
    return p
