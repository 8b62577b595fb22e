"""TensorRT engine-inspector JSON -> engine layers (the parsing half; the
mapping to ONNX nodes is `layermap.py`).

The format (no TensorRT needed to read it) is the one documented for
`IEngineInspector.get_engine_information(LayerInformationFormat.JSON)` with
`ProfilingVerbosity.DETAILED` (TensorRT developer guide, "Engine Inspector";
`include/NvInfer.h`, IEngineInspector and ILayer::setMetadata, NVIDIA/TensorRT
v10.16 and v11.1; Polygraphy `tools/inspect/subtool/model/extractors/_trt.py`
reads the same keys), and the one the real engines of trt-engine-explorer's
examples show (tests/fixtures/tensorrt/real/):

    {"Layers": [{"Name": "Conv_0 + Relu_1", "LayerType": "CaskConvolution",
                 "Inputs":  [{"Name": "Reformatted Input Tensor 0 to Conv_0 + Relu_1",
                              "Dimensions": [32, 3, 224, 224],
                              "Format/Datatype": "Channel major FP16 format where channel % 4 == 0"}],
                 "Outputs": [{"Name": "onnx::MaxPool_125", ...}],
                 "Metadata": "[ONNX Layer: Conv_0]\x1f[ONNX Layer: Relu_1]",
                 "TacticName": "...", "StreamId": 0}, ...],
     "Bindings": ["input.1", "191"]}

* TensorRT 11 splits "Format/Datatype" into "Datatype" and "Format" (noted in
  Polygraphy's inspector); both spellings are read.
* Below DETAILED verbosity a layer is only its name string.
* Layouts copies TensorRT adds are named `Reformatting CopyNode for Input|Output
  Tensor k to <layer>`; in real engines their LayerType is `Reformat` (Origin
  `REFORMAT`) or `NoOp`. A Q/DQ node can also become a `Reformat` layer (Origin
  `QDQ`, named after the node), and ONNX Transpose/Reshape nodes become `Shuffle`
  or `NoOp` layers: the layer type alone never says "copy".
* "Metadata" holds `[ONNX Layer: <node>]` entries separated by \x1f (and
  \x1e between groups), written by TensorRT's ONNX parser; a node inside an
  ONNX local function is written `[ONNX Layer: <node> | Local Function: <f>]`
  (onnx-tensorrt `processMetadata`). Myelin kernels may have it empty.

Every name here is data: it is only compared with names of the model, never
evaluated.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

_PRECISION_WORDS = (
    ("BF16", "bf16"), ("BFLOAT16", "bf16"),
    ("FP16", "fp16"), ("HALF", "fp16"),
    ("FP32", "fp32"), ("FLOAT", "fp32"),
    ("TF32", "tf32"),
    ("INT8", "int8"), ("FP8", "fp8"), ("INT4", "int4"), ("FP4", "fp4"),
    ("INT32", "int32"), ("INT64", "int64"), ("BOOL", "bool"),
)
# layer types that copy or relabel data; TensorRT inserts such layers itself,
# but ONNX Transpose/Reshape/Q/DQ nodes become them too (mapped by name or metadata)
RELABEL_TYPES = frozenset({"reformat", "reformatting", "shuffle", "noop", "copy"})
_FUNCTION_SEP = " | Local Function: "


@dataclass(frozen=True)
class InspectorTensor:
    name: str
    dims: tuple = ()
    datatype: str = ""  # as written ("Row major linear FP16 format", "Half", ...)

    @property
    def precision(self) -> str:
        return precision_word(self.datatype)


@dataclass
class InspectorLayer:
    """One layer of the built engine as the inspector lists it."""

    name: str
    layer_type: str = ""
    inputs: list[InspectorTensor] = field(default_factory=list)
    outputs: list[InspectorTensor] = field(default_factory=list)
    metadata_nodes: list[str] = field(default_factory=list)
    tactic: str = ""
    origin: str = ""  # "REFORMAT" for TensorRT's own layout copies, "QDQ"...
    # node -> ONNX local function it sits in ("" at top level), from Metadata
    metadata_functions: dict = field(default_factory=dict)

    @property
    def precision(self) -> str:
        """The precision the layer computes in, read from its first output
        (the inspector has no per-layer precision key; a "Precision" key, if a
        future release writes one, wins)."""
        for t in self.outputs:
            p = t.precision
            if p:
                return p
        return ""

    @property
    def is_copy(self) -> bool:
        """A layout copy TensorRT added (it computes nothing of the model)."""
        return self.name.startswith("Reformatting CopyNode") or self.origin.upper() == "REFORMAT"

    @property
    def relabels(self) -> bool:
        """Only copies or relabels data (a copy, or a Shuffle/NoOp/Reformat layer)."""
        return self.is_copy or self.layer_type.lower() in RELABEL_TYPES


def precision_word(datatype: str) -> str:
    up = (datatype or "").upper()
    if "N/A" in up:
        return ""
    for word, p in _PRECISION_WORDS:
        if re.search(r"(?<![A-Z0-9])" + word + r"(?![A-Z0-9])", up):
            return p
    return ""


def _tensor(d: Any) -> Optional[InspectorTensor]:
    if not isinstance(d, dict) or not isinstance(d.get("Name"), str):
        return None
    if isinstance(d.get("Format/Datatype"), str):
        dt = d["Format/Datatype"]
    else:  # TensorRT 11
        dt = " ".join(str(d[k]) for k in ("Datatype", "Format") if isinstance(d.get(k), str))
    dims = d.get("Dimensions")
    return InspectorTensor(d["Name"], tuple(dims) if isinstance(dims, list) else (), dt)


def metadata_entries(metadata: Any) -> list[tuple[str, str]]:
    """(node, local function or "") for each `[ONNX Layer: ...]` entry of a
    layer's Metadata, in order, without repeats."""
    if not isinstance(metadata, str) or not metadata:
        return []
    out: list[tuple[str, str]] = []
    for part in re.split(r"[\x1e\x1f]", metadata):
        part = part.strip()
        # entries can also follow each other without a separator
        for m in re.finditer(r"\[ONNX Layer: (.*?)\](?=\s*(?:\[ONNX Layer: |$))", part, re.S):
            name, function = m.group(1), ""
            if _FUNCTION_SEP in name:  # the parser writes the function after the node name
                name, function = name.rsplit(_FUNCTION_SEP, 1)
            if name and (name, function) not in out:
                out.append((name, function))
    return out


def metadata_nodes(metadata: Any) -> list[str]:
    """ONNX node names in a layer's Metadata (`[ONNX Layer: n]` entries)."""
    return list(dict.fromkeys(name for name, _ in metadata_entries(metadata)))


def parse_inspector(doc: Union[str, bytes, dict, list]) -> list[InspectorLayer]:
    """Layers of an engine from the inspector's JSON (the engine document, a
    bare list of layers, or its text). Unknown keys are ignored."""
    if isinstance(doc, (str, bytes)):
        doc = json.loads(doc)
    layers = doc.get("Layers", []) if isinstance(doc, dict) else doc
    if not isinstance(layers, list):
        raise ValueError("inspector JSON has no layer list")
    out: list[InspectorLayer] = []
    for i, item in enumerate(layers):
        if isinstance(item, str):  # profiling verbosity below DETAILED: names only
            out.append(InspectorLayer(name=item))
            continue
        if not isinstance(item, dict):
            continue
        name = item.get("Name")
        entries = metadata_entries(item.get("Metadata"))
        layer = InspectorLayer(
            name=name if isinstance(name, str) and name else f"layer_{i}",
            layer_type=str(item.get("LayerType") or ""),
            inputs=[t for t in map(_tensor, item.get("Inputs") or []) if t],
            outputs=[t for t in map(_tensor, item.get("Outputs") or []) if t],
            metadata_nodes=list(dict.fromkeys(n for n, _ in entries)),
            tactic=str(item.get("TacticName") or item.get("TacticValue") or ""),
            origin=str(item.get("Origin") or ""),
            metadata_functions={n: f for n, f in entries if f},
        )
        if isinstance(item.get("Precision"), str) and layer.outputs:
            layer.outputs[0] = InspectorTensor(layer.outputs[0].name, layer.outputs[0].dims, item["Precision"])
        out.append(layer)
    return out


