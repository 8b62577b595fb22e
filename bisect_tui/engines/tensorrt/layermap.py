"""Engine layers -> the ONNX nodes each one computes (the fused map).

Evidence per layer, strongest first:

1. tensors: a layer whose outputs are ONNX tensors covers the nodes between
   its inputs and those outputs. TensorRT's layout copies are looked through:
   `Reformatted Input Tensor k to L` stands for the tensor the copy read, and an
   output written through copies counts as the ONNX tensor the last copy
   writes (the real ResNet engines of trt-engine-explorer read
   `Conv_5 + Add_6 + Relu_7`'s inputs through two such copies);
2. Metadata `[ONNX Layer: n]`; a node of an ONNX local function (not a node of
   the top-level graph) stands for the one top-level node calling that
   function, when only one does;
3. the layer name, when 1 and 2 gave nothing.

Layers that only relabel data (Shuffle, NoOp, Reformat) take no tensor
evidence: TensorRT adds such layers itself and gives them ONNX tensor names
(`copied_squeeze_after_...` writes the graph output). They cover what their
metadata or name names (an ONNX Transpose becomes a Shuffle layer named after
it, a QuantizeLinear a Reformat layer), otherwise nothing, and then they are
looked through like copies.

Kernels of one Myelin graph (`..._myl<g>_<k>`) share the nodes between the
graph's inputs and outputs: a node no kernel names (TensorRT 10 splits a
softmax into `__myl_TraMaxSubExpSum_myl0_1` and `__myl_DivMul_myl0_2`, with
empty Metadata) goes to the kernel that runs where the node sits in graph
order, an unnamed kernel first. That last step is a guess by position, the
only one in this map.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from bisect_tui.core.graph import GraphIndex
from bisect_tui.api import FusedNode
from bisect_tui.engines.tensorrt.inspector import InspectorLayer
from bisect_tui.engines.tensorrt.layernames import MYELIN_SUFFIX, NameRange, name_parts, nodes_from_name


class _Flow:
    """Tensors seen through TensorRT's copies: engine-internal names back to
    the ONNX tensor a copy read, forward to the ONNX tensors copies write."""

    def __init__(self, copies: Iterable[InspectorLayer], index: GraphIndex):
        self._index = index
        self._back: dict = {}
        self._fwd: dict = defaultdict(list)
        for c in copies:
            if len(c.inputs) != 1:
                continue
            for o in c.outputs:
                self._back[o.name] = c.inputs[0].name
                self._fwd[c.inputs[0].name].append(o.name)

    def known(self, t: str) -> bool:
        ix = self._index
        return t in ix.producer or t in ix.initializers or t in ix.graph_inputs

    def source(self, t: str) -> str:
        seen = set()
        while not self.known(t) and t in self._back and t not in seen:
            seen.add(t)
            t = self._back[t]
        return t

    def sinks(self, t: str) -> list[str]:
        if self.known(t):
            return [t]
        out, stack, seen = [], [t], set()
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if self.known(x):
                out.append(x)
            else:
                stack.extend(self._fwd.get(x, ()))
        return out


def _metadata(layer: InspectorLayer, index: GraphIndex, callers: dict) -> list[str]:
    out = []
    for n in layer.metadata_nodes:
        if n in index.order:
            out.append(n)
            continue
        function = layer.metadata_functions.get(n)
        if function and len(callers.get(function, ())) == 1:
            out.append(callers[function][0])
    return out


def _nodes_from_tensors(layer: InspectorLayer, index: GraphIndex, engine_tensors: set, flow: _Flow) -> list[str]:
    """Nodes between the layer's inputs and its ONNX-named outputs.

    The walk back stops at the layer's inputs and at every tensor another
    engine layer writes. When an input another layer writes stays
    engine-internal after looking through copies, the boundary is unknown:
    only the direct producers count."""
    outs = sorted({s for t in layer.outputs for s in flow.sinks(t.name) if s in index.producer})
    if not outs:
        return []
    ins = {flow.source(t.name) for t in layer.inputs}
    if any(not flow.known(i) and i in engine_tensors for i in ins):
        return sorted({index.producer[t] for t in outs}, key=index.order.__getitem__)
    # an input no layer writes and the model lacks is the kernel's own constant
    return index.ancestors_within(outs, {i for i in ins if flow.known(i)} | (engine_tensors - set(outs)))


def _kernel_for(node: str, members: list[int], nodes: list[list[str]], index: GraphIndex) -> int:
    """The Myelin kernel a node no kernel names goes to: an unnamed kernel
    between the last kernel computing nodes before it and the next one, else
    that last kernel."""
    pos = index.order[node]
    before, unnamed = None, []
    for i in members:
        own = nodes[i]
        if not own:
            unnamed.append(i)
        elif max(index.order[x] for x in own) < pos:
            before, unnamed = i, []
        else:
            break
    if unnamed:
        return unnamed[0]
    return before if before is not None else members[0]


def _myelin_leftovers(layers, nodes, index: GraphIndex, engine_tensors: set, flow: _Flow) -> None:
    groups: dict = defaultdict(list)
    for i, la in enumerate(layers):
        m = MYELIN_SUFFIX.search(la.name)
        if m and not la.relabels:
            groups[m.group(1)].append(i)
    for members in groups.values():
        produced = {t.name for i in members for t in layers[i].outputs}
        ins = {flow.source(t.name) for i in members for t in layers[i].inputs if t.name not in produced}
        outs = {s for i in members for t in layers[i].outputs for s in flow.sinks(t.name) if s in index.producer}
        if not outs or any(not flow.known(t) and t in engine_tensors for t in ins):
            continue  # the graph's boundary is unknown: no guess
        assigned = {n for ns in nodes for n in ns}
        stop = {t for t in ins if flow.known(t)} | (engine_tensors - produced - outs)
        region = index.ancestors_within(outs, stop)
        for n in region:
            if n not in assigned:
                nodes[_kernel_for(n, members, nodes, index)].append(n)
                assigned.add(n)


def fused_nodes_from_inspector(layers: Iterable[InspectorLayer], index: GraphIndex) -> list[FusedNode]:
    """One FusedNode per engine layer, in engine order (see the module
    docstring for the evidence). For a ForeignNode range, nodes that another
    layer already proves by tensors or metadata are left to that layer."""
    layers = list(layers)
    callers: dict = defaultdict(list)  # op type -> top-level nodes of it (local function calls)
    for n in index.nodes:
        callers[n.op_type].append(n.name)
    named_relabel = {}
    for i, la in enumerate(layers):
        if la.relabels and not la.is_copy:
            named_relabel[i] = _metadata(la, index, callers) or nodes_from_name(la.name, index)
    flow = _Flow([la for i, la in enumerate(layers) if la.is_copy or (i in named_relabel and not named_relabel[i])],
                 index)
    engine_tensors = {t.name for la in layers for t in la.outputs}
    evidence: list[list[str]] = []
    for i, la in enumerate(layers):
        if la.is_copy or i in named_relabel:
            evidence.append(list(named_relabel.get(i, [])))
            continue
        got = set(_nodes_from_tensors(la, index, engine_tensors, flow))
        got.update(_metadata(la, index, callers))
        evidence.append(sorted(got, key=index.order.__getitem__))
    claimed = {n for ev in evidence for n in ev}
    nodes: list[list[str]] = []
    for i, (la, ev) in enumerate(zip(layers, evidence)):
        found = list(ev)
        if not found and not la.is_copy and i not in named_relabel:
            named = nodes_from_name(la.name, index)
            has_range = any(isinstance(p, NameRange) for p in name_parts(la.name))
            found = [n for n in named if not (has_range and n in claimed)] if has_range else named
        nodes.append(found)
    _myelin_leftovers(layers, nodes, index, engine_tensors, flow)
    return [
        FusedNode(
            name=la.name,
            op_type=la.layer_type or "TensorRTLayer",
            domain="tensorrt",
            inputs=[t.name for t in la.inputs],
            outputs=[t.name for t in la.outputs],
            original_nodes=sorted(ns, key=index.order.__getitem__),
            passes=[],
        )
        for la, ns in zip(layers, nodes)
    ]


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
