"""ONNX Runtime as the fused engine: what it declares (options, capabilities),
readable without importing onnxruntime or onnx; the engine itself lives in
`engine.py` and is loaded on first use.

Every name the old single module exported (`OrtEngine`, `fused_node_map`,
`known_optimizers`...) is still importable from here."""

from __future__ import annotations

from bisect_tui.api import LEVELS, Capabilities, EngineOption

ORT_PRECISIONS = ("fp32", "fp16")
# short names a user types for the execution providers ORT builds can carry
PROVIDER_NAMES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "dnnl": "DnnlExecutionProvider",
}

LABEL = "ONNX Runtime"

# A protobuf message cannot be serialized above 2 GiB; stay well below it.
_EXTERNAL_DATA_THRESHOLD = 1_800_000_000

OPTIONS = (
    EngineOption("level", "choice", "all", "graph optimization level of the fused engine (default all)",
                 "--level", "level", choices=LEVELS, label="level", form_id="level"),
    EngineOption("config", "mapping", (), "session config entry, e.g. optimization.enable_gelu_approximation=1 "
                 "(checked against the installed ORT)", "--ort-config", "config_entries", metavar="KEY=VALUE",
                 label="config entries", form_id="entries",
                 placeholder="e.g. optimization.enable_gelu_approximation=1"),
    EngineOption("disable", "list", (), "disable an optimizer by name (checked against the installed ORT)",
                 "--disable", "disabled_passes", metavar="OPTIMIZER", label="disable optim.",
                 form_id="disabled", placeholder="e.g. GeluApproximation"),
    EngineOption("provider", "list", (), "execution provider before the CPU fallback: "
                 + ", ".join(PROVIDER_NAMES) + " (when the installed onnxruntime has it)",
                 "--ort-provider", "providers", metavar="NAME", label="providers", in_form=False),
)

CAPABILITIES = Capabilities(
    marking=True, marking_blocks=True, pass_switches=True, keep_high_precision=True,
    levels=LEVELS, precisions=ORT_PRECISIONS,
    observation="the saved optimized graph rerun at ORT_DISABLE_ALL: its surviving tensors marked, "
                "no fusion undone",
    coarse_domains=("com.microsoft.nchwc",),
    concurrent_builds=True,
)


def load():
    """The engine object (imports the engine module and, lazily, its library)."""
    from bisect_tui.engines.ort.engine import OrtEngine

    return OrtEngine()


def __getattr__(name: str):
    # the engine's helpers, loaded lazily so that importing the declarations stays cheap
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib

    mod = importlib.import_module("bisect_tui.engines.ort.engine")
    try:
        return getattr(mod, name)
    except AttributeError:
        raise AttributeError(f"module 'bisect_tui.engines.ort' has no attribute {name!r}") from None
