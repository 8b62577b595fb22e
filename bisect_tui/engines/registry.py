"""Which engines exist: one line each. A new engine is one new package plus a
line here (or, for an engine that lives elsewhere, an entry in the
`BISECT_TUI_ENGINES` environment variable); nothing in core/, the app or the
CLI names engines.

An engine module declares `LABEL`, `OPTIONS` and `CAPABILITIES` without
importing its library (so `--help` and the settings form stay fast) and
`load()` returns the engine object (an `api.EngineBase`)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from bisect_tui.api import UserError, did_you_mean

# registry key -> module
ENGINES: dict[str, str] = {
    "ort": "bisect_tui.engines.ort",
    "openvino": "bisect_tui.engines.openvino",
    "tensorrt": "bisect_tui.engines.tensorrt",
}
ALIASES: dict[str, str] = {"onnxruntime": "ort", "ov": "openvino"}
# engines outside this package: "name=module[,name=module]" (the module importable
# on sys.path, declaring what the modules above declare); a built-in name is not replaced
PLUGINS_VARIABLE = "BISECT_TUI_ENGINES"


def _plugins() -> dict[str, str]:
    out: dict[str, str] = {}
    for item in os.environ.get(PLUGINS_VARIABLE, "").split(","):
        name, _, module = item.strip().partition("=")
        if name.strip() and module.strip() and name.strip() not in ENGINES:
            out[name.strip()] = module.strip()
    return out


def _all() -> dict[str, str]:
    return {**ENGINES, **_plugins()}


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def declaration(name: str) -> ModuleType:
    """The engine's module: `LABEL`, `OPTIONS`, `CAPABILITIES`, `load()`; cheap to import."""
    engines = _all()
    key = canonical(name)
    target = engines.get(key)
    if target is None:
        raise UserError(f"unknown engine {name!r}; available: {', '.join(engines)}"
                        + did_you_mean(name, list(engines) + list(ALIASES)))
    try:
        return importlib.import_module(target)
    except ImportError as exc:
        raise UserError(f"engine {key!r} ({target}) cannot be imported: {exc}") from None


def get_engine(name: str):
    return declaration(name).load()


def engine_names() -> list[str]:
    return list(_all())


def default_reference():
    """The unfused FP32 side the baseline runs on: ONNX Runtime with every
    optimization off (the one reference this tool ships; api/reference.py)."""
    from bisect_tui.engines.ort.unfused import OrtUnfused

    return OrtUnfused()
