"""Which engines exist: one line each. A new engine is one new module (or
package) plus a line here; nothing in core/ or the CLI names engines.

An engine module declares `LABEL`, `OPTIONS` and `CAPABILITIES` without
importing its library (so `--help` and the settings form stay fast) and
`load()` returns the engine object."""

from __future__ import annotations

import importlib
from types import ModuleType

# registry key -> module
ENGINES: dict[str, str] = {
    "ort": "bisect_tui.engines.ort",
    "openvino": "bisect_tui.engines.openvino",
    "tensorrt": "bisect_tui.engines.tensorrt",
}
ALIASES: dict[str, str] = {"onnxruntime": "ort", "ov": "openvino"}


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def declaration(name: str) -> ModuleType:
    """The engine's module: `LABEL`, `OPTIONS`, `CAPABILITIES`, `load()`; cheap to import."""
    from bisect_tui.core.errors import UserError

    key = canonical(name)
    target = ENGINES.get(key)
    if target is None:
        from bisect_tui.api import did_you_mean

        raise UserError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}"
                        + did_you_mean(name, list(ENGINES) + list(ALIASES)))
    return importlib.import_module(target)


def get_engine(name: str):
    return declaration(name).load()


def engine_names() -> list[str]:
    return list(ENGINES)
