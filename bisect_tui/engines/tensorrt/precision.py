"""Which TensorRT network layers to pin to FP32 for a keep-set of ONNX nodes.

TensorRT's ONNX parser names each network layer after the ONNX node it comes
from (extra layers for one node get the node name plus a suffix), writes the
node name into the layer's metadata (`[ONNX Layer: <name>]`, TensorRT 10+),
and names the layer outputs after the node outputs. Pins are matched on those
three, never on fused engine layer names (TensorRT silently ignores a
precision constraint on a name that is not a network layer).

A pinned layer gets `precision = FLOAT` and FP32 output types; with
`precision_constraints="obey"` TensorRT must honour both or fail the build, so
a restored tolerance really proves the pinned layers were the problem.
Strongly typed networks (always so in TensorRT 11) reject layer precisions:
there the keep-set is applied to the ONNX model instead (those nodes stay FP32
when the model is converted to FP16), see `PrecisionPlan.mode`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Collection, Iterable

from bisect_tui.engines.tensorrt.inspector import metadata_nodes

# output dtypes a precision pin makes sense for (shape/index tensors are not)
_FLOAT_TYPES = frozenset({"", "FLOAT", "HALF", "BF16", "FP32", "FP16", "FLOAT16", "BFLOAT16"})


@dataclass(frozen=True)
class NetworkLayer:
    """A layer of the parsed (not yet built) network, as needed for pinning."""

    name: str
    outputs: tuple = ()  # output tensor names
    output_types: tuple = ()  # TensorRT dtype names ("FLOAT", "HALF", "INT64"...)
    metadata: str = ""
    layer_type: str = ""


@dataclass
class PrecisionPlan:
    mode: str  # "none" | "layer_precisions" | "typed_model"
    pins: dict = field(default_factory=dict)  # layer name -> "fp32"
    by_node: dict = field(default_factory=dict)  # ONNX node -> [layer names]
    unmatched: list = field(default_factory=list)  # keep-set nodes no layer came from

    def to_dict(self) -> dict:
        return {"mode": self.mode, "pins": dict(self.pins), "by_node": {k: list(v) for k, v in self.by_node.items()},
                "unmatched": list(self.unmatched)}


def _is_float(layer: NetworkLayer) -> bool:
    return all(str(t).upper().replace("DATATYPE.", "") in _FLOAT_TYPES for t in layer.output_types)


def layers_for_nodes(
    layers: Iterable[NetworkLayer],
    keep: Collection[str],
    node_outputs: dict,
) -> dict:
    """ONNX node name -> network layer names that came from it.

    `node_outputs` maps each keep-set node to its ONNX output tensor names."""
    keep = list(dict.fromkeys(keep))
    result: dict = {k: [] for k in keep}
    out_owner = {t: n for n in keep for t in node_outputs.get(n, ())}
    for la in layers:
        owners = set()
        if la.name in result:
            owners.add(la.name)
        else:
            for n in keep:  # parser suffixes: "<node>_<k>", "<node>/..."
                if re.match(re.escape(n) + r"(?:_[0-9]+|/.+|_[A-Za-z]+_[0-9]+)$", la.name):
                    owners.add(n)
        owners.update(out_owner[t] for t in la.outputs if t in out_owner)
        owners.update(n for n in metadata_nodes(la.metadata) if n in result)
        for n in owners:
            result[n].append(la.name)
    return result


def plan_keep_fp32(
    layers: Iterable[NetworkLayer],
    keep: Collection[str],
    node_outputs: dict,
    strongly_typed: bool,
) -> PrecisionPlan:
    keep = sorted(set(keep))
    if not keep:
        return PrecisionPlan("none")
    if strongly_typed:
        return PrecisionPlan("typed_model", by_node={k: [] for k in keep})
    layers = list(layers)
    by_node = layers_for_nodes(layers, keep, node_outputs)
    float_layers = {la.name for la in layers if _is_float(la)}
    pins = {name: "fp32" for names in by_node.values() for name in names if name in float_layers}
    unmatched = [n for n, names in by_node.items() if not names]
    return PrecisionPlan("layer_precisions", pins=pins, by_node=by_node, unmatched=unmatched)
