"""Every model of the onnx wheel's backend test data that plain ONNX Runtime runs also
runs through `check` to a verdict (issue 21).

The corpus ships with the installed onnx package (simple/, pytorch-converted/,
pytorch-operator/, light/; node/ holds single-operator conformance cases and is
left out). Plain ORT is the judge of what "runs": an InferenceSession fed the
model's own test_data_set_0 inputs (light/ has none: generated ones). Where it
runs, `check` must end with 0, 1 or 4 (NaN/Inf in the baseline, and then the
model's own outputs hold one). Where ORT cannot load an opset-6 model, `check`
must say so in one line with the conversion command, and the converted model must
then run through `check` too (where plain ORT runs the conversion: not so for the
three PRelu-6 models with a per-channel slope). Models ORT refuses for other reasons (the preview
training Gradient op, a locale the machine lacks) are skipped with ORT's words.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper, version_converter

from bisect_tui.core.legacy_models import RUNTIME_MIN_OPSET, default_opset

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
# light/: >0.5 GB of weights made at run time, 10-30 s each here
HEAVY = {"light/light_bvlc_alexnet", "light/light_vgg19", "light/light_zfnet512"}


def _corpus() -> list[tuple[str, Path, Path | None]]:
    out = []
    for folder in ("simple", "pytorch-converted", "pytorch-operator"):
        for case in sorted((DATA / folder).iterdir()):
            if (case / "model.onnx").exists():
                out.append((f"{folder}/{case.name}", case / "model.onnx", case / "test_data_set_0"))
    out += [(f"light/{f.stem}", f, None) for f in sorted((DATA / "light").glob("*.onnx"))]
    return out


CORPUS = _corpus()


def _params():
    for name, path, data in CORPUS:
        marks = [pytest.mark.slow] if name in HEAVY else []
        yield pytest.param(path, data, id=name, marks=marks)


def _session(model) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 4  # the locale failure prints a coloured ERROR line otherwise
    blob = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])


def _own_inputs(sess: ort.InferenceSession, data: Path | None) -> dict[str, np.ndarray]:
    if data is not None and data.is_dir():
        files = sorted(data.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
        arrays = [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]
        return dict(zip((i.name for i in sess.get_inputs()), arrays))
    rng = np.random.default_rng(0)
    return {i.name: rng.random([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
            for i in sess.get_inputs()}


# One worker process runs every `check` of this module in-process (as fast as calling
# main here), so 150 checks' threads, sessions and allocator growth stay out of the
# test process: run here, they bloated it past 1 GB and slowed the app tests after it.
_WORKER = """
import contextlib, io, json, sys
from bisect_tui.cli import main
for line in sys.stdin:
    argv = json.loads(line)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    sys.__stdout__.write(json.dumps([code, err.getvalue().strip()]) + "\\n")
    sys.__stdout__.flush()
"""


class _Checker:
    def __init__(self):
        import os
        import sys

        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=dict(os.environ))

    def __call__(self, argv: list[str]) -> tuple[int, str]:
        import json

        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the check worker died"
        code, err = json.loads(line)
        return code, err

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(60)
        self.proc.stdout.close()  # else the interpreter's exit warns of an unclosed file


@pytest.fixture(scope="module", autouse=True)
def _worker():
    global _run
    checker = _Checker()
    _run = checker
    yield
    checker.close()


_run = None


def _check(model: Path, workdir: Path, feeds: dict | None) -> tuple[int, str]:
    argv = ["check", str(model), "--no-determinism", "--no-arbiter", "-q", "--session", str(workdir / "s")]
    if feeds:
        workdir.mkdir(parents=True, exist_ok=True)
        np.savez(workdir / "inputs.npz", **feeds)
        argv += ["--input", str(workdir / "inputs.npz")]
    return _run(argv)


def _assert_verdict(code: int, err: str, outputs: list) -> None:
    assert code in (0, 1, 4), f"exit {code}: {err}"
    if code == 4:  # the documented exit for a NaN/Inf baseline: the model's own outputs show it
        assert any(isinstance(o, np.ndarray) and o.dtype.kind == "f" and not np.isfinite(o).all()
                   for o in outputs), err


@pytest.mark.parametrize("path, data", _params())
def test_check_runs_what_plain_ort_runs(path: Path, data: Path | None):
    model = onnx.load(str(path))
    try:
        sess = _session(path)
        feeds = _own_inputs(sess, data)
        outputs = sess.run(None, feeds)
    except Exception as exc:
        message = str(exc).strip().splitlines()[0]
        if "Could not find an implementation" not in message:
            pytest.skip(f"plain ONNX Runtime refuses it too: {message[:160]}")
        _check_refuses_old_opset(path, model, data)
        return
    with tempfile.TemporaryDirectory(prefix="onnx_corpus_") as tmp:
        if any(a.dtype.kind in "OUS" for a in feeds.values()):
            # strings: nothing to measure a tolerance on; check says so in one line
            code, err = _check(path, Path(tmp), None)
            assert code == 2 and "cannot generate (object)" in err and "\n" not in err, err
            return
        code, err = _check(path, Path(tmp), feeds if data is not None else None)
    _assert_verdict(code, err, outputs)


def _check_refuses_old_opset(path: Path, model: onnx.ModelProto, data: Path | None) -> None:
    """ORT cannot load it: check names the conversion, and the converted model runs."""
    assert 0 < default_opset(model) < RUNTIME_MIN_OPSET
    with tempfile.TemporaryDirectory(prefix="onnx_corpus_") as tmp:
        code, err = _check(path, Path(tmp), None)
        assert code == 2 and "\n" not in err, err
        assert f"imports opset {default_opset(model)}" in err and "version_converter" in err, err
        upgraded = version_converter.convert_version(model, RUNTIME_MIN_OPSET)
        try:
            sess = _session(upgraded)
            feeds = _own_inputs(sess, data)
            outputs = sess.run(None, feeds)
        except Exception as exc:  # PRelu-6 with a per-channel slope: the converter keeps its shape
            pytest.skip(f"plain ONNX Runtime cannot run the converted model either: "
                        f"{str(exc).strip().splitlines()[0][:160]}")
        converted = Path(tmp) / "converted.onnx"
        onnx.save(upgraded, converted)
        code, err = _check(converted, Path(tmp) / "c", feeds)
    _assert_verdict(code, err, outputs)


def test_offered_conversion_command_works(tmp_path: Path):
    """The command in the refusal, run by a shell as printed, writes a model check accepts."""
    path = DATA / "pytorch-converted" / "test_PReLU_1d" / "model.onnx"
    code, err = _check(path, tmp_path, None)
    assert code == 2
    command = err.split("`")[1]
    subprocess.run(command, shell=True, cwd=tmp_path, check=True)
    written = shlex.split(err.rsplit(" on ", 1)[1])[0]
    assert (tmp_path / written).exists()
    assert default_opset(onnx.load(str(tmp_path / written))) == RUNTIME_MIN_OPSET
    code, err = _check(tmp_path / written, tmp_path / "after", None)
    assert code == 0, err


def test_corpus_is_the_whole_backend_data():
    """A smaller onnx wheel must not silently shrink what this file claims."""
    folders = {name.split("/")[0] for name, _, _ in CORPUS}
    assert folders == {"simple", "pytorch-converted", "pytorch-operator", "light"}
    assert len(CORPUS) >= 149
