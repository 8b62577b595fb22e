"""OpenVINO as the fused engine: its declarations (options, capabilities),
readable without importing openvino; the engine is in `engine.py`."""

from __future__ import annotations

from bisect_tui.api import Capabilities, EngineOption

OV_PRECISIONS = ("fp32", "bf16", "fp16")
_HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}

LABEL = "OpenVINO"

OPTIONS = (
    EngineOption("device", "text", "CPU", "OpenVINO device", "--ov-device", "options.device",
                 label="device", placeholder="CPU"),
    EngineOption("config", "mapping", (), "compile property KEY=VALUE, e.g. NUM_STREAMS=1 (checked against "
                 "the device's supported properties)", "--ov-config", "config_entries", metavar="KEY=VALUE",
                 label="properties", placeholder="KEY=VALUE, ... e.g. NUM_STREAMS=1"),
    EngineOption("mark", "list", (), "add this tensor to the model's outputs before compiling (blocks a "
                 "fusion across it: the workaround `bisect` proves)", "--ov-mark", "options.mark",
                 metavar="TENSOR", label="mark tensors", placeholder="tensor names, e.g. norm/reduce:0"),
)

CAPABILITIES = Capabilities(
    marking=True, marking_blocks=False, pass_switches=False, keep_high_precision=False,
    levels=("all",), precisions=OV_PRECISIONS,
    observation="extra outputs at the runtime graph's own layer boundaries (they undo no fusion; "
                "checked per build)",
)


def load():
    """The engine object (imports the engine module and, lazily, its library)."""
    from bisect_tui.engines.openvino.engine import OpenVinoEngine

    return OpenVinoEngine()
