"""TensorRT engine-inspector JSON -> fused-node records mapped to ONNX nodes.

The format (no TensorRT needed to read it) is the one documented for
`IEngineInspector.get_engine_information(LayerInformationFormat.JSON)` with
`ProfilingVerbosity.DETAILED` (TensorRT developer guide, "Engine Inspector";
`include/NvInfer.h`, IEngineInspector and ILayer::setMetadata, NVIDIA/TensorRT
v10.16 and v11.1; Polygraphy `tools/inspect/subtool/model/extractors/_trt.py`
reads the same keys):

    {"Layers": [{"Name": "Conv_0 + Relu_1", "LayerType": "CaskConvolution",
                 "Inputs":  [{"Name": "x", "Dimensions": [1, 3, 8, 8],
                              "Format/Datatype": "Row major linear FP32"}],
                 "Outputs": [{"Name": "relu_out", ...}],
                 "Metadata": "[ONNX Layer: Conv_0]\\x1f[ONNX Layer: Relu_1]",
                 "TacticName": "...", "StreamId": 0}, ...],
     "Bindings": ["x", "relu_out"]}

* TensorRT 11 splits "Format/Datatype" into "Datatype" and "Format" (noted in
  Polygraphy's inspector); both spellings are read.
* Below DETAILED verbosity a layer is only its name string; then only the
  name can be mapped.
* Layer names carry the ONNX node names they merge: `A + B` (fusion),
  `PWN(A, PWN(B))` (pointwise fusion), `{ForeignNode[first...last]}` (a Myelin
  region from the first to the last node in graph order), `name_myl0_3`
  (Myelin kernels of TensorRT 10.x+), `Reformatting CopyNode for ...` (layout
  copies TensorRT adds; they belong to no ONNX node).
* "Metadata" holds `[ONNX Layer: <node name>]` entries separated by \\x1f (and
  \\x1e between groups), written by TensorRT's ONNX parser.

Mapping order: tensor names first (a layer whose outputs are ONNX tensors
covers the nodes between its inputs and outputs), then the ONNX node names in
Metadata, then the names in the layer name. Every name here is data: it is
only compared with names of the model, never evaluated.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Union

from bisect_tui.core.graph import GraphIndex
from bisect_tui.api import FusedNode

_MYELIN_SUFFIX = re.compile(r"_myl[0-9]+_[0-9]+$")
_FOREIGN = re.compile(r"^\{ForeignNode\[(.*)\]\}$", re.S)
_PRECISION_WORDS = (
    ("BF16", "bf16"), ("BFLOAT16", "bf16"),
    ("FP16", "fp16"), ("HALF", "fp16"),
    ("FP32", "fp32"), ("FLOAT", "fp32"),
    ("TF32", "tf32"),
    ("INT8", "int8"), ("FP8", "fp8"), ("INT4", "int4"), ("FP4", "fp4"),
    ("INT32", "int32"), ("INT64", "int64"), ("BOOL", "bool"),
)
# layer types that only copy/relabel data (TensorRT inserts them itself)
_COPY_TYPES = frozenset({"reformat", "reformatting", "shuffle", "noop", "copy"})


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
        return self.layer_type.lower() in _COPY_TYPES or self.name.startswith("Reformatting CopyNode")


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


def metadata_nodes(metadata: Any) -> list[str]:
    """ONNX node names in a layer's Metadata (`[ONNX Layer: n]` entries)."""
    if not isinstance(metadata, str) or not metadata:
        return []
    out: list[str] = []
    for part in re.split(r"[\x1e\x1f]", metadata):
        part = part.strip()
        # entries can also follow each other without a separator
        for m in re.finditer(r"\[ONNX Layer: (.*?)\](?=\s*(?:\[ONNX Layer: |$))", part, re.S):
            name = m.group(1)
            if name and name not in out:
                out.append(name)
    return out


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
        layer = InspectorLayer(
            name=name if isinstance(name, str) and name else f"layer_{i}",
            layer_type=str(item.get("LayerType") or ""),
            inputs=[t for t in map(_tensor, item.get("Inputs") or []) if t],
            outputs=[t for t in map(_tensor, item.get("Outputs") or []) if t],
            metadata_nodes=metadata_nodes(item.get("Metadata")),
            tactic=str(item.get("TacticName") or item.get("TacticValue") or ""),
        )
        if isinstance(item.get("Precision"), str) and layer.outputs:
            layer.outputs[0] = InspectorTensor(layer.outputs[0].name, layer.outputs[0].dims, item["Precision"])
        out.append(layer)
    return out


# ------------------------------------------------------------------ layer names


@dataclass(frozen=True)
class NameRange:
    """`{ForeignNode[first...last]}`: every node from first to last in graph order."""

    first: str
    last: str


def _split_top(text: str, sep: str) -> list[str]:
    """Split on `sep` outside parentheses/brackets (node names can hold `+`)."""
    parts, depth, cur, i = [], 0, [], 0
    while i < len(text):
        ch = text[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        if depth == 0 and text.startswith(sep, i):
            parts.append("".join(cur))
            cur = []
            i += len(sep)
            continue
        cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def name_parts(layer_name: str) -> list[Union[str, NameRange]]:
    """The ONNX node names (and ranges) a TensorRT layer name is made of."""
    out: list[Union[str, NameRange]] = []
    for part in _split_top(layer_name.strip(), " + "):
        m = _FOREIGN.match(part)
        if m:
            inner = m.group(1)
            if "..." in inner:
                first, last = inner.split("...", 1)
                out.append(NameRange(first.strip(), last.strip()))
            else:
                out.extend(name_parts(inner))
            continue
        if part.startswith("PWN(") and part.endswith(")"):
            for sub in _split_top(part[4:-1], ","):
                out.extend(name_parts(sub))
            continue
        out.append(part)
    return out


def _resolve_name(name: str, index: GraphIndex) -> Optional[str]:
    if name in index.order:
        return name
    base = _MYELIN_SUFFIX.sub("", name)
    if base in index.order:
        return base
    return None


def nodes_from_name(layer_name: str, index: GraphIndex) -> list[str]:
    """ONNX nodes named in a layer name, topological order; unknown names dropped."""
    found: set[str] = set()
    topo = [n.name for n in index.nodes]
    for part in name_parts(layer_name):
        if isinstance(part, NameRange):
            a, b = _resolve_name(part.first, index), _resolve_name(part.last, index)
            if a is None or b is None:
                found.update(x for x in (a, b) if x)
                continue
            i, j = sorted((index.order[a], index.order[b]))
            found.update(topo[i : j + 1])
        else:
            r = _resolve_name(part, index)
            if r:
                found.add(r)
    return sorted(found, key=index.order.__getitem__)


# ------------------------------------------------------------------ the map


def _nodes_from_tensors(layer: InspectorLayer, index: GraphIndex, engine_tensors: set[str]) -> list[str]:
    """Nodes between the layer's inputs and its ONNX-named outputs.

    The walk back stops at the layer's inputs and at every tensor another
    engine layer writes. When an input is an engine-internal name (not an
    ONNX tensor) the boundary is unknown, so only the direct producers count."""
    outs = [t.name for t in layer.outputs if t.name in index.producer]
    if not outs:
        return []
    ins = {t.name for t in layer.inputs}
    if any(i not in index.producer and i not in index.initializers and i not in index.graph_inputs for i in ins):
        return sorted({index.producer[t] for t in outs}, key=index.order.__getitem__)
    stop = ins | (engine_tensors - set(outs))
    return index.ancestors_within(outs, stop)


def fused_nodes_from_inspector(layers: Iterable[InspectorLayer], index: GraphIndex) -> list[FusedNode]:
    """One FusedNode per engine layer, in engine order.

    A layer covers: the nodes its tensors prove (outputs back to inputs), plus
    the nodes its Metadata names, plus (only when neither gave anything) the
    nodes its name lists. For a ForeignNode range, nodes that another layer
    already proves by tensors or metadata are left to that layer. Copy layers
    TensorRT adds cover nothing."""
    layers = list(layers)
    engine_tensors = {t.name for la in layers for t in la.outputs}
    evidence: list[list[str]] = []
    for la in layers:
        if la.is_copy:
            evidence.append([])
            continue
        got = set(_nodes_from_tensors(la, index, engine_tensors))
        got.update(n for n in la.metadata_nodes if n in index.order)
        evidence.append(sorted(got, key=index.order.__getitem__))
    claimed = {n for ev in evidence for n in ev}
    out: list[FusedNode] = []
    for la, ev in zip(layers, evidence):
        nodes = list(ev)
        if not nodes and not la.is_copy:
            named = nodes_from_name(la.name, index)
            has_range = any(isinstance(p, NameRange) for p in name_parts(la.name))
            nodes = [n for n in named if not (has_range and n in claimed)] if has_range else named
        out.append(
            FusedNode(
                name=la.name,
                op_type=la.layer_type or "TensorRTLayer",
                domain="tensorrt",
                inputs=[t.name for t in la.inputs],
                outputs=[t.name for t in la.outputs],
                original_nodes=nodes,
                passes=[],
            )
        )
    return out


def fusions_across(fused: Iterable[FusedNode], marks: Iterable[str], index: GraphIndex) -> list[FusedNode]:
    """Engine layers that still hide a marked tensor inside.

    Marking a tensor as a network output usually stops TensorRT fusing across
    it, but a Myelin region can write the extra output and stay one kernel.
    A layer hides mark `t` when it covers the node producing `t` and a node
    consuming `t`, yet `t` is not one of the layer's outputs: the tensor exists
    only inside the fused kernel, so the search must judge that region in
    isolation instead of trusting the mark."""
    marks = [m for m in dict.fromkeys(marks) if m in index.producer]
    out: list[FusedNode] = []
    for f in fused:
        covered = set(f.original_nodes)
        if len(covered) < 2:
            continue
        for t in marks:
            if t in f.outputs:
                continue
            if index.producer[t] in covered and covered & set(index.consumers.get(t, ())):
                out.append(f)
                break
    return out
