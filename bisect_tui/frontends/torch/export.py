"""Exporting the module to ONNX inside the session directory.

Two exporters exist in torch 2.13: the torch.export-based one (`dynamo=True`,
the default since 2.9, needs onnxscript) and the legacy TorchScript tracer
(`dynamo=False`, deprecated). `auto` tries the first and falls back to the
second with the reason recorded. They differ in ways a user must know: the
tracer records Python values computed from tensors (`float(x.max())`) as
constants, torch.export keeps them as graph ops. Both leave the module path
on every node (node metadata `pkg.torch.onnx.name_scopes`, or the tracer's
`/blocks.0/attn/MatMul` node names), which the cross-check uses.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import re
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch

from bisect_tui.core.errors import UserError
from bisect_tui.frontends.torch import TorchSpec
from bisect_tui.frontends.torch.factory import Loaded

EXTERNAL_DATA_ABOVE = 1 << 30  # weights beyond this go to a .data file beside the model


@dataclass
class ExportResult:
    path: str
    exporter: str  # "dynamo" (torch.export) or "torchscript"
    torch_version: str
    opset: int
    seconds: float
    fallback_reason: Optional[str] = None  # why auto did not use the dynamo exporter
    tracer_warnings: list[str] = field(default_factory=list)
    log_file: Optional[str] = None

    def to_dict(self) -> dict:
        return asdict(self)


def _quiet_torch_loggers(sink: io.StringIO):
    """torch's loggers (their own stderr handlers included) write into `sink`
    for the export: a failed shape guard logged `E1201 ... always_classified is
    unsupported` lines above the one-line error."""
    names = ["torch", "torch.onnx", "torch.export", "torch.fx", "torch._dynamo", "onnxscript"]

    @contextlib.contextmanager
    def ctx():
        handler = logging.StreamHandler(sink)
        saved = {}
        for n in names:
            lg = logging.getLogger(n)
            saved[n] = (lg.level, list(lg.handlers), lg.propagate)
            for h in list(lg.handlers):
                lg.removeHandler(h)
            lg.addHandler(handler)
            lg.propagate = False
            lg.setLevel(logging.WARNING)
        try:
            yield
        finally:
            for n, (lvl, handlers, propagate) in saved.items():
                lg = logging.getLogger(n)
                lg.removeHandler(handler)
                for h in handlers:
                    lg.addHandler(h)
                lg.propagate = propagate
                lg.setLevel(lvl)

    return ctx()


@contextlib.contextmanager
def _jit_log_into(sink: io.StringIO):
    """The TorchScript exporter prints "Torch IR graph at exception: ..." (40 lines
    on a real model) from C++ straight to stdout: its logging switch cannot be
    turned off (torch 2.13 enables it whatever `verbose` says). Its one entry
    point is swapped for one that writes into the export log."""
    C = torch._C
    original = getattr(C, "_jit_onnx_log", None)
    if original is None:
        yield
        return

    def into_log(*parts):
        sink.write("".join(str(p) for p in parts) + "\n")

    C._jit_onnx_log = into_log
    try:
        yield
    finally:
        C._jit_onnx_log = original


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _reason(exc: BaseException) -> str:
    """The exporter's own words, first line, colours removed; the root cause
    (torch.export's guard on a data-dependent value...) when it wraps one."""
    parts = []
    e: Optional[BaseException] = exc
    while e is not None and len(parts) < 3:
        text = _ANSI.sub("", str(e)).strip()
        parts.append(f"{type(e).__name__}: {text.splitlines()[0][:240] if text else ''}".rstrip(": "))
        e = e.__cause__
    return " <- ".join(reversed(parts)) if len(parts) > 1 else parts[0]


def _one_export(loaded: Loaded, args: tuple, path: Path, dynamo: bool, log: io.StringIO) -> list[str]:
    with warnings.catch_warnings(record=True) as caught, _quiet_torch_loggers(log), _jit_log_into(log), \
            contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        warnings.simplefilter("always")
        kwargs = dict(input_names=list(loaded.input_names), dynamo=dynamo)
        if dynamo:
            kwargs["external_data"] = loaded.state_bytes > EXTERNAL_DATA_ABOVE
        with torch.no_grad():
            torch.onnx.export(loaded.module, args, str(path), **kwargs)
    for w in caught:
        log.write(f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})\n")
    return [f"{w.category.__name__}: {str(w.message).splitlines()[0][:300]}" for w in caught
            if issubclass(w.category, torch.jit.TracerWarning)]


def export(loaded: Loaded, args: tuple, outdir: Path, spec: TorchSpec) -> ExportResult:
    """Export into `outdir/exported.onnx` with the chosen exporter; one line on failure."""
    import onnx

    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "exported.onnx"
    for stale in (path, outdir / "exported.onnx.data"):
        if stale.exists():
            stale.unlink()
    t0 = time.perf_counter()
    fallback = None
    order = {"auto": [True, False], "dynamo": [True], "torchscript": [False]}[spec.exporter]
    last_error = None
    log = io.StringIO()
    log_file = outdir / "export.log"
    for dynamo in order:
        log.write(f"--- {'dynamo' if dynamo else 'torchscript'} exporter\n")
        try:
            if dynamo:  # the dynamo exporter needs onnxscript: a missing one is said plainly
                importlib.import_module("onnxscript")
            notes = _one_export(loaded, args, path, dynamo, log)
            break
        except Exception as exc:
            last_error = f"{'dynamo' if dynamo else 'torchscript'} exporter: {_reason(exc)}"
            log.write(f"failed: {last_error}\n")
            if dynamo and len(order) > 1:
                fallback = last_error
            continue
    else:
        log_file.write_text(log.getvalue(), encoding="utf-8")
        raise UserError(f"--torch {spec.text}: ONNX export failed ({last_error}); the exporters' own output "
                        f"is in {log_file}")
    log_file.write_text(log.getvalue(), encoding="utf-8")
    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return ExportResult(
        path=str(path), exporter="dynamo" if dynamo else "torchscript", torch_version=torch.__version__,
        opset=int(opset), seconds=time.perf_counter() - t0, fallback_reason=fallback,
        tracer_warnings=sorted(set(notes)), log_file=str(log_file),
    )
