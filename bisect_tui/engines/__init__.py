"""Engines behind one small interface (see `base.py`).

Each engine module imports its heavy library lazily, inside functions."""

from __future__ import annotations

from bisect_tui.engines.base import BuiltEngine, Engine, EngineConfig, FusedNode


def get_engine(name: str) -> Engine:
    if name in ("ort", "onnxruntime"):
        from bisect_tui.engines.ort import OrtEngine

        return OrtEngine()
    from bisect_tui.core.errors import UserError

    raise UserError(f"unknown engine {name!r}; available: ort")


__all__ = ["BuiltEngine", "Engine", "EngineConfig", "FusedNode", "get_engine"]
