"""Which TensorRT network layers to pin to FP32 for a keep-set of ONNX nodes.

TensorRT's ONNX parser (onnx-tensorrt `registerLayer`) names each network
layer after the ONNX node it comes from; a name already taken gets `_<k>`
appended, k from one counter for the whole model, so `/m/Add_1` may be
`/m/Add`'s second layer or the node `/m/Add_1`'s first. It also writes
`[ONNX Layer: <node>]` into the layer's metadata (`processMetadata`, TensorRT
10+; `| Local Function: <f>` inside an ONNX local function) and names the
layer outputs after the node outputs. Pins are matched on metadata when a
layer has it (it is exact), else on the name (the longest ONNX node name the
layer name extends, never a name that is itself another node's), and on output
tensor names; never on fused engine layer names (TensorRT silently ignores a
precision constraint on a name that is not a network layer).

A pinned layer gets `precision = FLOAT` and FP32 output types on its float
outputs; with `precision_constraints="obey"` TensorRT must honour both or fail
the build, so a restored tolerance really proves the pinned layers were the
problem. Layers whose output type is their own parameter (Cast, Quantize,
Dequantize, DynamicQuantize, Fill: `setToType`) get no output type:
NvInfer.h says the types passed to setOutputType and setToType must match.
Strongly typed networks (always so in TensorRT 11) reject layer precisions:
there the keep-set is applied to the ONNX model instead (those nodes stay FP32
when the model is converted to FP16), see `PrecisionPlan.mode`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Collection, Iterable, Optional

from bisect_tui.engines.tensorrt.inspector import metadata_entries

# output dtypes a precision pin makes sense for (shape/index tensors are not)
_FLOAT_TYPES = frozenset({"", "FLOAT", "HALF", "BF16", "FP32", "FP16", "FLOAT16", "BFLOAT16"})
# layers whose output type is set by setToType (NvInfer.h): no setOutputType on them
_OWN_OUTPUT_TYPE = frozenset({"CAST", "QUANTIZE", "DEQUANTIZE", "DYNAMIC_QUANTIZE", "FILL"})
_SUFFIX = re.compile(r"(?:_[0-9]+|/.+|_[A-Za-z]+_[0-9]+)$")


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
    output_types: dict = field(default_factory=dict)  # layer name -> output indices typed FP32

    def to_dict(self) -> dict:
        return {"mode": self.mode, "pins": dict(self.pins), "by_node": {k: list(v) for k, v in self.by_node.items()},
                "unmatched": list(self.unmatched), "output_types": {k: list(v) for k, v in self.output_types.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "PrecisionPlan":
        """The plan a cached engine was built with (its record in the cache)."""
        return cls(str(d.get("mode", "none")), dict(d.get("pins") or {}),
                   {k: list(v) for k, v in (d.get("by_node") or {}).items()}, list(d.get("unmatched") or []),
                   {k: [int(i) for i in v] for k, v in (d.get("output_types") or {}).items()})


def _float_type(t) -> bool:
    return str(t).upper().replace("DATATYPE.", "") in _FLOAT_TYPES


def _is_float(layer: NetworkLayer) -> bool:
    return all(_float_type(t) for t in layer.output_types)


def owner_by_name(layer_name: str, nodes: Collection[str]) -> Optional[str]:
    """The ONNX node a parser layer name comes from: the name itself when it
    is a node, else the longest node name it extends by a parser suffix."""
    if layer_name in nodes:
        return layer_name
    cuts = sorted({m.start() for m in re.finditer(r"[_/]", layer_name)}, reverse=True)
    for cut in cuts:
        base = layer_name[:cut]
        if base in nodes and _SUFFIX.fullmatch(layer_name[cut:]):
            return base
    return None


def layers_for_nodes(
    layers: Iterable[NetworkLayer],
    keep: Collection[str],
    node_outputs: dict,
    node_types: Optional[dict] = None,
) -> dict:
    """ONNX node name -> network layer names that came from it.

    `node_outputs` maps every node of the model to its ONNX output tensor
    names, `node_types` to its op type (a local function's name is the op type
    of the node calling it)."""
    keep = list(dict.fromkeys(keep))
    result: dict = {k: [] for k in keep}
    nodes = set(node_outputs) | set(keep)
    out_owner = {t: n for n in keep for t in node_outputs.get(n, ())}
    callers: dict = defaultdict(list)
    for n, op in (node_types or {}).items():
        callers[op].append(n)
    for la in layers:
        owners = set()
        entries = metadata_entries(la.metadata)
        for name, function in entries:
            if name not in nodes and function and len(callers[function]) == 1:
                name = callers[function][0]
            if name in result:
                owners.add(name)
        if not entries:  # no metadata: the name, which is ambiguous (see the module docstring)
            owner = owner_by_name(la.name, nodes)
            if owner in result:
                owners.add(owner)
        owners.update(out_owner[t] for t in la.outputs if t in out_owner)
        for n in owners:
            result[n].append(la.name)
    return result


def plan_keep_fp32(
    layers: Iterable[NetworkLayer],
    keep: Collection[str],
    node_outputs: dict,
    strongly_typed: bool,
    node_types: Optional[dict] = None,
) -> PrecisionPlan:
    keep = sorted(set(keep))
    if not keep:
        return PrecisionPlan("none")
    if strongly_typed:
        return PrecisionPlan("typed_model", by_node={k: [] for k in keep})
    layers = list(layers)
    by_node = layers_for_nodes(layers, keep, node_outputs, node_types)
    by_name = {la.name: la for la in layers}
    pins = {name: "fp32" for names in by_node.values() for name in names if _is_float(by_name[name])}
    outputs = {}
    for name in pins:
        la = by_name[name]
        if la.layer_type.upper() not in _OWN_OUTPUT_TYPE:
            outputs[name] = [i for i, t in enumerate(la.output_types) if _float_type(t)]
    unmatched = [n for n, names in by_node.items() if not names]
    return PrecisionPlan("layer_precisions", pins=pins, by_node=by_node, unmatched=unmatched, output_types=outputs)
