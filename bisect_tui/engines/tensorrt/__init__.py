"""TensorRT through Polygraphy (`--engine tensorrt`, optional extra `.[tensorrt]`).

What it declares (options, capabilities) is readable without TensorRT; the
engine lives in `engine.py` and imports tensorrt only when it builds. The
modules here split what can be verified anywhere (inspector JSON -> ONNX
nodes, FP32 pins, engine cache, optimization profiles, option checks, feature
detection) from the thin part that needs TensorRT and a GPU (`engine.py`)."""

from __future__ import annotations

from bisect_tui.engines.tensorrt.declare import CAPABILITIES, OPTIONS

LABEL = "TensorRT"


def load(**kwargs):
    """The engine object (TensorRT itself is imported on the first build)."""
    from bisect_tui.engines.tensorrt.engine import TensorRTEngine

    return TensorRTEngine(**kwargs)


__all__ = ["CAPABILITIES", "LABEL", "OPTIONS", "load"]
