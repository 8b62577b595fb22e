"""Engines behind one contract (`bisect_tui.api`), listed in `registry.py`.

Each engine module imports its heavy library lazily, inside functions. The
names below are loaded on first use (PEP 562): importing one engine's module
(the determinism check's second interpreter imports only the unfused
reference) runs this file first, and it then paid for the whole contract and
the registry."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bisect_tui.api import (
        BuiltEngine,
        Capabilities,
        Engine,
        EngineBuildError,
        EngineConfig,
        EngineOption,
        EngineRunError,
        FusedNode,
        ReproSpec,
        Switch,
    )
    from bisect_tui.engines.registry import declaration, engine_names, get_engine

__all__ = ["BuiltEngine", "Capabilities", "Engine", "EngineBuildError", "EngineConfig", "EngineOption",
           "EngineRunError", "FusedNode", "ReproSpec", "Switch", "declaration", "engine_names", "get_engine"]
_REGISTRY = ("declaration", "engine_names", "get_engine")


def __getattr__(name: str):
    if name not in __all__:  # a submodule (`from bisect_tui.engines import ort`) is then imported
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = "bisect_tui.engines.registry" if name in _REGISTRY else "bisect_tui.api"
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
