"""What the installed TensorRT lets a bisection do, in user words (the
`capabilities` answer; `features.py` says how each fact is detected)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from bisect_tui.engines.tensorrt.features import TrtFeatures

INSTALL_HINT = (
    "TensorRT is not installed: on a machine with an NVIDIA GPU run "
    "`pip install -e '.[tensorrt]'` (or scripts/gpu_check.sh)"
)


@dataclass
class TrtCapabilities:
    """What the installed TensorRT lets a bisection do, in user words."""

    available: bool
    reason: str = ""
    marking: str = "network outputs (breaks fusion at the marked tensor)"
    observation: str = ""
    keep_fp32: str = ""
    disable_passes: str = "not available: TensorRT has no per-pass switch; use marking or FP32 pins"
    on_marking_failure: str = (
        "when marking makes the build fail, the engine is rebuilt unmarked and the bisection "
        "falls back to region isolation (the failing marks are reported)"
    )
    features: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def capabilities_for(features: Optional[TrtFeatures], reason: str = "") -> TrtCapabilities:
    if features is None:
        return TrtCapabilities(available=False, reason=reason or INSTALL_HINT)
    if features.mark_unfused_debug:
        obs = "debug tensors (mark_unfused_tensors_as_debug_tensors): fusion is kept, fused-away tensors are absent"
    elif features.mark_debug:
        obs = "marked debug tensors (mark_debug): may block fusion at the marked tensors"
    else:
        obs = "network outputs: blocks fusion at the observed tensors"
    if features.layer_precisions:
        keep = "layer precisions pinned to FP32 with obeyed precision constraints"
    else:
        keep = "strongly typed network: the keep-set nodes stay FP32 when the model is converted to FP16"
    return TrtCapabilities(available=True, observation=obs, keep_fp32=keep, features=features.to_dict())
