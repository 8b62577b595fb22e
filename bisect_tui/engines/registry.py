"""Which engines exist: one line each. A new engine is one new module (or
package) plus a line here; nothing in core/ or the CLI names engines."""

from __future__ import annotations

import importlib
from typing import Iterator

# registry key -> "module:Class"; the module must import its engine library lazily
ENGINES: dict[str, str] = {
    "ort": "bisect_tui.engines.ort:OrtEngine",
    "openvino": "bisect_tui.engines.openvino:OpenVinoEngine",
}
ALIASES: dict[str, str] = {"onnxruntime": "ort", "ov": "openvino"}


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def engine_class(name: str):
    """The engine class (its declarations: options, capabilities), imported lazily."""
    from bisect_tui.core.errors import UserError

    key = canonical(name)
    target = ENGINES.get(key)
    if target is None:
        from bisect_tui.engines.base import did_you_mean

        raise UserError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}"
                        + did_you_mean(name, list(ENGINES) + list(ALIASES)))
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def get_engine(name: str):
    return engine_class(name)()


def engine_names() -> Iterator[str]:
    return iter(ENGINES)
