"""Engines behind one small interface (see `base.py`), listed in `registry.py`.

Each engine module imports its heavy library lazily, inside functions."""

from __future__ import annotations

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
