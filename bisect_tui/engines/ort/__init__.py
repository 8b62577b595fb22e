"""ONNX Runtime as the fused engine: what it declares (options, capabilities),
readable without importing onnxruntime or onnx; the engine itself lives in
`engine.py` and is loaded on first use.

Every name the old single module exported (`OrtEngine`, `fused_node_map`,
`known_optimizers`...) is still importable from here."""

from __future__ import annotations

# the declarations, imported on first use: the determinism check's second
# interpreter imports this package for its unfused reference (unfused.py) only
_DECLARED = ("CAPABILITIES", "CPU_PROVIDER", "LABEL", "OPTIONS", "ORT_PRECISIONS", "PROVIDER_NAMES", "providers_of")


def load():
    """The engine object (imports the engine module and, lazily, its library)."""
    from bisect_tui.engines.ort.engine import OrtEngine

    return OrtEngine()


def __getattr__(name: str):
    # the engine's helpers, loaded lazily so that importing the declarations stays cheap
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib

    if name in _DECLARED:
        value = getattr(importlib.import_module("bisect_tui.engines.ort.declare"), name)
        globals()[name] = value
        return value
    mod = importlib.import_module("bisect_tui.engines.ort.engine")
    try:
        return getattr(mod, name)
    except AttributeError:
        raise AttributeError(f"module 'bisect_tui.engines.ort' has no attribute {name!r}") from None
