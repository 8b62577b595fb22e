"""What the installed TensorRT can do, learnt from the module, never from a
version table alone.

Facts checked in NVIDIA/TensorRT's headers (include/NvInfer.h):

* v10.x: `BuilderFlag.FP16/BF16/INT8/OBEY_PRECISION_CONSTRAINTS` exist
  (deprecated in 10.16 in favour of strongly typed networks);
  `NetworkDefinitionCreationFlag.STRONGLY_TYPED` is opt-in;
  `INetworkDefinition.markDebug` exists since 10.0;
  `markUnfusedTensorsAsDebugTensors` is absent from v10.8 and present later.
* v11.x: those precision flags are gone, `kSTRONGLY_TYPED` is "always
  enabled" (kept only for API compatibility) and "setting layer precision and
  layer output types is not allowed": reduced precision must come from the
  model's own types, and a keep-set means FP32 nodes in the ONNX model.

The Python names are the snake/upper-case spellings Polygraphy uses
(`trt.BuilderFlag.FP16`, `network.mark_debug`,
`network.mark_unfused_tensors_as_debug_tensors`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Collection


@dataclass(frozen=True)
class TrtFeatures:
    version: str
    major: int
    precision_flags: frozenset  # subset of {"FP16", "BF16", "INT8", "TF32"} the builder takes
    obey_precision_constraints: bool
    always_strongly_typed: bool
    mark_debug: bool
    mark_unfused_debug: bool
    engine_inspector: bool

    @property
    def layer_precisions(self) -> bool:
        """Per-layer FP32 pins are possible (weakly typed network with obeyed constraints)."""
        return not self.always_strongly_typed and self.obey_precision_constraints

    def to_dict(self) -> dict:
        d = asdict(self)
        d["precision_flags"] = sorted(self.precision_flags)
        d["layer_precisions"] = self.layer_precisions
        return d


def _major(version: str) -> int:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 0


def features_from_names(
    version: str,
    builder_flags: Collection[str],
    network_methods: Collection[str],
    engine_methods: Collection[str] = (),
) -> TrtFeatures:
    """The pure part: decide from the names a TensorRT module exposes."""
    flags = set(builder_flags)
    methods = set(network_methods)
    major = _major(version)
    precision = frozenset(f for f in ("FP16", "BF16", "INT8", "TF32") if f in flags)
    return TrtFeatures(
        version=str(version),
        major=major,
        precision_flags=precision,
        obey_precision_constraints="OBEY_PRECISION_CONSTRAINTS" in flags,
        # no FP16 flag = the builder only takes types from the network
        always_strongly_typed=major >= 11 or "FP16" not in flags,
        mark_debug="mark_debug" in methods,
        mark_unfused_debug="mark_unfused_tensors_as_debug_tensors" in methods,
        engine_inspector="create_engine_inspector" in set(engine_methods),
    )


def detect(trt: Any) -> TrtFeatures:
    """Features of an imported `tensorrt` module."""
    flags = [n for n in dir(getattr(trt, "BuilderFlag", object)) if n.isupper()]
    network = [n for n in dir(getattr(trt, "INetworkDefinition", object)) if not n.startswith("_")]
    engine = [n for n in dir(getattr(trt, "ICudaEngine", object)) if not n.startswith("_")]
    return features_from_names(getattr(trt, "__version__", "0"), flags, network, engine)
