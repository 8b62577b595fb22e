"""OpenVINO as the fused engine: its declarations (options, capabilities),
readable without importing openvino; the engine is in `engine.py`."""

from __future__ import annotations

from bisect_tui.engines.openvino.declare import _HINTS, CAPABILITIES, LABEL, OPTIONS, OV_PRECISIONS  # noqa: F401


def load():
    """The engine object (imports the engine module and, lazily, its library)."""
    from bisect_tui.engines.openvino.engine import OpenVinoEngine

    return OpenVinoEngine()
