"""TensorRT through Polygraphy (`--engine tensorrt`, optional extra `.[tensorrt]`).

The modules here split what can be verified anywhere (inspector JSON ->
ONNX nodes, FP32 pins, engine cache, optimization profiles, option checks,
feature detection) from the thin part that needs TensorRT and a GPU
(`engine.py`). Nothing imports tensorrt at module import time.
"""

from __future__ import annotations


def get_engine(**kwargs):
    from bisect_tui.engines.tensorrt.engine import TensorRTEngine

    return TensorRTEngine(**kwargs)
