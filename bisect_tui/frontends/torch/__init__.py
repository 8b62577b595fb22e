"""PyTorch front end: `--torch module.path:factory`.

The user's factory returns an `nn.Module` (or a module and its example inputs).
It is put in eval mode, exported to ONNX into the session directory, and the
normal checklist runs on that export. Before any engine is judged, forward hooks
on every submodule record PyTorch's own FP32 outputs (`layer_<index>_<module
path>`), twice, and those are cross-checked against the ONNX baseline, so a
broken export is caught as an export problem, not blamed on a fusion.

This module holds only the spec (no torch import): the CLI parses it before
anything heavy loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bisect_tui.core.errors import UserError

EXPORTERS = ("auto", "dynamo", "torchscript")
_SPEC = re.compile(r"^(?P<module>[^:]+):(?P<factory>[A-Za-z_][A-Za-z0-9_]*)$")


@dataclass(frozen=True)
class TorchSpec:
    """Where the model comes from: `package.module:factory` or `path/to/file.py:factory`."""

    module: str
    factory: str
    exporter: str = "auto"

    @classmethod
    def parse(cls, text: str, exporter: str = "auto") -> "TorchSpec":
        m = _SPEC.match(text.strip())
        if not m:
            raise UserError(f"bad --torch {text!r}: expected module.path:factory (or file.py:factory)")
        if exporter not in EXPORTERS:
            raise UserError(f"bad exporter {exporter!r}: choose {', '.join(EXPORTERS)}")
        mod = m.group("module").strip()
        if not mod.endswith(".py") and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", mod):
            raise UserError(f"bad --torch {text!r}: {mod!r} is neither a dotted module path nor a .py file")
        return cls(mod, m.group("factory"), exporter)

    @property
    def text(self) -> str:
        return f"{self.module}:{self.factory}"

    def to_dict(self) -> dict:
        return {"spec": self.text, "exporter": self.exporter}

    @classmethod
    def from_dict(cls, d: dict) -> "TorchSpec":
        return cls.parse(d["spec"], d.get("exporter", "auto"))


def looks_like_spec(text: str) -> bool:
    """For the app's picker: `pkg.mod:factory` rather than a path (a Windows
    drive letter or an existing file is a path)."""
    from pathlib import Path

    t = text.strip()
    if Path(t).exists() or re.match(r"^[A-Za-z]:[\\/]", t):
        return False
    return bool(_SPEC.match(t))
