"""Quiet by default: what the libraries print goes to the session, the terminal
gets bisect-tui's own lines and one line saying where the rest is.

Real code paths only: a user's --torch module that torch cannot export (its
TorchScript exporter printed the whole Torch IR from C++ before our one-line
error), and a user's factory whose numpy arithmetic overflows (numpy's own
RuntimeWarning, the kind onnx's reference evaluator raised on Silero VAD FP16)."""

from __future__ import annotations

import logging
import textwrap
import warnings

import numpy as np

from bisect_tui.cli import main
from bisect_tui.libnoise import LOG_NAME, LibraryNoise

UNEXPORTABLE = '''
import torch
from torch import nn

class Eig(nn.Module):
    def forward(self, x):
        return torch.linalg.eigvals(x).real

def eig():
    return Eig(), (torch.randn(1, 4, 4),)
'''

NOISY_FACTORY = '''
import numpy as np
import torch
from torch import nn

def noisy():
    scale = float(np.minimum(np.exp(np.float32(100.0)), 2.0))  # numpy warns: overflow in exp
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4)).eval(), (torch.randn(1, 4) * scale,)
'''


def _module(tmp_path, monkeypatch, name, text):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_failed_torch_export_is_one_line_and_its_ir_is_in_the_log(tmp_path, monkeypatch, capfd):
    _module(tmp_path, monkeypatch, "nu_unexportable", UNEXPORTABLE)
    # the TorchScript exporter alone (auto tries torch.export first, seconds more, then this one)
    code = main(["check", "--torch", "nu_unexportable:eig", "--exporter", "torchscript",
                 "--session", str(tmp_path / "s"), "-q"])
    out, err = capfd.readouterr()  # file-descriptor level: torch's C++ printed straight to stdout
    assert code == 2
    assert "Torch IR" not in out + err and "aten::" not in out
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("bisect-tui: error: --torch nu_unexportable:eig: ONNX export failed")
    log = tmp_path / "s" / "torch" / "export.log"
    assert str(log) in lines[0]
    text = log.read_text()
    assert "Torch IR graph at exception" in text and "aten::linalg_eigvals" in text
    assert "--- torchscript exporter" in text


def test_library_warnings_go_to_the_session_log(tmp_path, monkeypatch, capfd):
    _module(tmp_path, monkeypatch, "nu_noisy", NOISY_FACTORY)
    code = main(["check", "--torch", "nu_noisy:noisy", "--session", str(tmp_path / "s"), "-q",
                 "--no-determinism", "--no-arbiter"])
    out, err = capfd.readouterr()
    assert code == 0, out + err
    assert "RuntimeWarning" not in out
    said = [ln for ln in err.splitlines() if "warning(s) from the libraries" in ln]
    assert len(said) == 1 and "overflow encountered in exp" in said[0]
    log = tmp_path / "s" / "log" / LOG_NAME
    assert str(log) in said[0]
    assert "RuntimeWarning: overflow encountered in exp" in log.read_text()


def test_logging_without_handlers_and_no_session_are_printed_whole(monkeypatch):
    monkeypatch.setattr(logging.root, "handlers", [])  # as in the CLI's process (pytest adds its own)
    noise = LibraryNoise().start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            np.log(np.zeros(1))  # numpy: divide by zero encountered in log
        logging.getLogger("nu.some.library").warning("a library with no handler of its own")
    finally:
        said = noise.finish(None)
    assert warnings.showwarning is not noise._show  # restored
    assert "RuntimeWarning: divide by zero encountered in log" in said
    assert "WARNING nu.some.library: a library with no handler of its own" in said


def test_every_next_line_names_a_step_still_ahead(samples, tmp_path, capsys):
    """check says to bisect; bisect, which has just bisected, does not."""
    model = samples / "fp16_keepset.onnx"
    args = ["--precision", "fp16", "--session", str(tmp_path / "s"), "-q", "--no-determinism", "--no-arbiter"]
    assert main(["check", str(model), *args]) == 1
    out = capsys.readouterr().out
    assert "next: run `bisect-tui bisect` with the same options" in out
    assert main(["bisect", str(model), *args]) == 1
    out = capsys.readouterr().out
    assert "bisect-tui bisect`" not in out and "keep-set: keep 2 of 12" in out
    assert all("bisect-tui bisect" not in ln for ln in out.splitlines() if ln.startswith("next:"))


def test_license_is_an_spdx_string():
    """A TOML table made setuptools >= 77 print its deprecation banner on every `pip install -e .`."""
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in meta["build-system"]["requires"])
