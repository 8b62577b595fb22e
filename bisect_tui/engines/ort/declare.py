"""What ONNX Runtime declares to the contract (options, capabilities), and the
settings it reads back from a config; no onnxruntime import."""

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
                 "--ort-provider", "options.providers", metavar="NAME", label="providers", in_form=False,
                 ordered=True, normalized=True, implied=("CPUExecutionProvider",)),
)
CPU_PROVIDER = "CPUExecutionProvider"


def providers_of(config) -> tuple[str, ...]:
    """The execution providers a config asks for, the CPU fallback last."""
    return config.option_list("providers", (CPU_PROVIDER,))

CAPABILITIES = Capabilities(
    marking=True, marking_blocks=True, pass_switches=True, keep_high_precision=True,
    levels=LEVELS, precisions=ORT_PRECISIONS,
    observation="the saved optimized graph rerun at ORT_DISABLE_ALL: its surviving tensors marked, "
                "no fusion undone",
    coarse_domains=("com.microsoft.nchwc",),
    concurrent_builds=True,
)
