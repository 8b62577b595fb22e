"""ONNX Runtime's names for the optimization levels: the one table the
engine, its log reader and its repro scripts share."""

from __future__ import annotations

LEVEL_NAMES = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def graph_level(ort, level: str):
    """The `GraphOptimizationLevel` of one of our level names (`ort`: the imported module)."""
    return getattr(ort.GraphOptimizationLevel, LEVEL_NAMES[level])
