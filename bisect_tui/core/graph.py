"""ONNX graph helpers: naming, topology, marking outputs, and types of tensors.

All engines build from the *prepared* model (every node named, written once into
the session directory), so node names are stable keys everywhere: in the
baseline manifest, the fused-node map, bisection steps and reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Collection, Iterable, Optional

import onnx
from onnx import shape_inference

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(name: str, limit: int = 80) -> str:
    """A tensor name made safe for every file system (and still readable)."""
    s = _SAFE.sub("_", name).strip("._") or "tensor"
    if len(s) > limit:
        import hashlib

        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        s = s[: limit - 9] + "_" + digest
    return s


def name_nodes(model: onnx.ModelProto) -> int:
    """Give every unnamed (or duplicate-named) top-level node a unique name.

    Returns how many nodes were renamed. Names follow `{op}_{index}` so users
    can find them in Netron by position."""
    seen: set[str] = set()
    renamed = 0
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            base = f"{node.op_type}_{i}"
            name = base
            k = 1
            while name in seen:
                name = f"{base}_{k}"
                k += 1
            node.name = name
            renamed += 1
        seen.add(node.name)
    return renamed


@dataclass
class GraphIndex:
    """Topology of the top-level graph, computed once per model."""

    nodes: list[onnx.NodeProto]
    order: dict[str, int]  # node name -> topological index
    producer: dict[str, str]  # tensor -> node name
    consumers: dict[str, list[str]]  # tensor -> node names
    graph_inputs: list[str]
    graph_outputs: list[str]
    initializers: set[str]
    by_name: dict[str, onnx.NodeProto] = field(default_factory=dict)
    # node name -> its inputs as node_inputs gives them: walks back through a
    # 5,000-node graph read them thousands of times from the protobuf objects
    inputs: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def build(cls, model: onnx.ModelProto) -> "GraphIndex":
        # Each protobuf field is read once into plain lists (every read of a
        # NodeProto field crosses into the C extension and builds new objects).
        g = model.graph
        inits = {i.name for i in g.initializer} | {
            i.values.name for i in g.sparse_initializer
        }
        raw = list(g.node)
        written, outs, ins = node_io(raw)
        order = topo_order(ins, outs, {i.name for i in g.input} | inits)
        nodes = [raw[k] for k in order]
        names = [n.name for n in nodes]
        outs = [outs[k] for k in order]
        ins = [ins[k] for k in order]
        producer: dict[str, str] = {}
        consumers: dict[str, list[str]] = {}
        tensors: list[str] = []
        for name, n_outs, n_ins in zip(names, outs, ins):
            for o in n_outs:
                if o:
                    producer[o] = name
                    tensors.append(o)
            for t in n_ins:
                c = consumers.get(t)
                if c is None:
                    consumers[t] = [name]
                else:
                    c.append(name)
        by_name = dict(zip(names, nodes))  # a repeated name: the last one, as everywhere
        index = cls(
            nodes=nodes,
            order={name: pos for pos, name in enumerate(names)},
            producer=producer,
            consumers=consumers,
            graph_inputs=[i.name for i in g.input if i.name not in inits],
            graph_outputs=[o.name for o in g.output],
            initializers=inits,
            by_name=by_name,
            inputs=dict(zip(names, ins)),
        )
        # read already: what intermediate_tensors and io_by_name would read again
        index.__dict__["_tensors"] = (nodes, len(nodes), tuple(tensors))
        index.__dict__["_io"] = (by_name, len(by_name), dict(zip(names, zip([written[k] for k in order], outs))))
        return index

    def intermediate_tensors(self) -> list[str]:
        """Every tensor produced by a node, in topological order (outputs included).

        Walked once per index (and again only if its node list changed): the dump, the
        probe, each search and each early build ask, 0.05 s a time at 21,000 nodes."""
        memo = self.__dict__.get("_tensors")
        if memo is None or memo[0] is not self.nodes or memo[1] != len(self.nodes):
            out: list[str] = []
            for n in self.nodes:
                out.extend(o for o in n.output if o)
            memo = self.__dict__["_tensors"] = (self.nodes, len(self.nodes), tuple(out))
        return list(memo[2])

    def io_by_name(self) -> dict[str, tuple[list[str], list[str]]]:
        """Node name -> (its inputs as written, its outputs as written), plain
        lists kept beside `by_name` (the unit builder reads them for every covered
        node of every fused node, a protobuf read each). Read-only."""
        memo = self.__dict__.get("_io")
        by_name = self.by_name
        if memo is None or memo[0] is not by_name or memo[1] != len(by_name):
            names = list(by_name)
            written, outs, _ = node_io([by_name[n] for n in names])
            memo = self.__dict__["_io"] = (by_name, len(by_name), dict(zip(names, zip(written, outs))))
        return memo[2]

    def ancestors_within(self, tensors: Iterable[str], stop: set[str]) -> list[str]:
        """Node names reached walking back from `tensors`, not crossing `stop` tensors."""
        return sorted(self.ancestor_set(tensors, stop), key=self.order.__getitem__)

    def ancestor_set(self, tensors: Iterable[str], stop: Collection[str]) -> set[str]:
        """`ancestors_within` as an unordered set (for callers that merge or sort later)."""
        seen: set[str] = set()
        producer = self.producer
        inputs = self.inputs
        inits = self.initializers
        stack = [t for t in tensors if t not in stop]
        pop, push = stack.pop, stack.append
        while stack:
            p = producer.get(pop())
            if p is None or p in seen:
                continue
            seen.add(p)
            ins = inputs.get(p)
            for i in ins if ins is not None else node_inputs(self.by_name[p]):
                if i not in stop and i not in inits:
                    push(i)
        return seen


_GRAPH_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """Inputs of a node including tensors used implicitly by its subgraphs (If/Loop/Scan)."""
    return _inputs_of(node, node.input[:])


def _inputs_of(node: onnx.NodeProto, written: list[str]) -> list[str]:
    """`node_inputs` from the node's inputs as written (`written`, read already):
    that very list where nothing is dropped or added."""
    names = written
    if "" in names:
        names = [i for i in names if i]
    if node.attribute:
        extra = _implicit_inputs(node)
        if extra:
            names = names + extra
    return names


def _implicit_inputs(node: onnx.NodeProto) -> list[str]:
    """Outer-scope tensors the node's subgraphs read, in the order they are met."""
    names: list[str] = []
    for attr in node.attribute:
        t = attr.type
        if t not in _GRAPH_TYPES and (t or not (attr.HasField("g") or len(attr.graphs))):
            continue  # no subgraph (a type-less attribute is looked into, as before)
        subgraphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
        for sg in subgraphs:
            local = {i.name for i in sg.initializer} | {i.name for i in sg.input}
            for sn in sg.node:
                local.update(o for o in sn.output)
            for sn in sg.node:
                for i in node_inputs(sn):
                    if i not in local:
                        names.append(i)
    return names


def node_io(nodes: list[onnx.NodeProto]) -> tuple[list, list, list]:
    """Per node, each field read once: its inputs as written, its outputs as
    written, and its `node_inputs` (where that is the same list as the first,
    it is the same object: share, don't modify)."""
    written = [n.input[:] for n in nodes]
    outs = [n.output[:] for n in nodes]
    return written, outs, [_inputs_of(n, names) for n, names in zip(nodes, written)]


def toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Stable topological sort (ONNX requires it, but not every exporter obeys)."""
    return toposort_with_inputs(nodes, available)[0]


def toposort_with_inputs(
    nodes: list[onnx.NodeProto], available: set[str]
) -> tuple[list[onnx.NodeProto], list[list[str]]]:
    """`toposort`, with each sorted node's `node_inputs` beside it (read once per node)."""
    nodes = list(nodes)
    _, outs, ins = node_io(nodes)
    order = topo_order(ins, outs, available)
    return [nodes[k] for k in order], [ins[k] for k in order]


def topo_order(ins: list[list[str]], outs: list[list[str]], available: Iterable[str]) -> list[int]:
    """Positions of a stable topological order of nodes given as plain lists.

    Passes over the pending nodes in file order, each taking every node whose
    inputs are available (or produced by no node at all), until none is left
    or a pass takes nothing (a cycle: the rest keep their file order). A node
    waits only on `missing`, the produced tensors not available yet, so one
    set check per node and pass replaces a look-up per input."""
    missing: set[str] = set().union(*outs)
    missing.difference_update(available)
    missing.discard("")
    pending: Iterable[int] = range(len(ins))
    order: list[int] = []
    isdisjoint, done, take = missing.isdisjoint, missing.difference_update, order.append
    while True:
        rest: list[int] = []
        taken = len(order)
        for k in pending:
            if isdisjoint(ins[k]):
                take(k)
                if missing:
                    done(outs[k])
            else:
                rest.append(k)
        if not rest:
            return order
        if len(order) == taken:  # a cycle: keep the file order for the rest
            order.extend(rest)
            return order
        pending = rest


def tensor_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Types (and shapes where known) of every tensor, via ONNX shape inference."""
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # inference is best effort; fall back to what the file declares
        inferred = model
    g = inferred.graph
    types: dict[str, onnx.TypeProto] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        types[vi.name] = vi.type
    for init in g.initializer:
        t = onnx.TypeProto()
        t.tensor_type.elem_type = init.data_type
        for d in init.dims:
            t.tensor_type.shape.dim.add().dim_value = d
        types.setdefault(init.name, t)
    return types


def mark_outputs(
    model: onnx.ModelProto,
    tensors: Iterable[str],
    types: Optional[dict[str, onnx.TypeProto]] = None,
    keep_original: bool = True,
) -> onnx.ModelProto:
    """Return a copy of `model` whose graph outputs include `tensors`.

    Marking a tensor as an output is the switch this tool is built on: most
    engines refuse to fuse across a graph output. Types come from shape
    inference; a tensor of unknown type is marked with no type at all, which
    the engines accept and resolve at session creation (an UNDEFINED elem
    type is rejected)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    existing = [o.name for o in m.graph.output]
    if not keep_original:
        del m.graph.output[:]
        existing = []
    have = set(existing)
    if types is None:
        types = tensor_types(model)
    add = m.graph.output.add  # filled in place: append() would copy each one again
    for t in tensors:
        if t in have or not t:
            continue
        vi = add()
        vi.name = t
        tt = types.get(t)
        if tt is not None and tt.HasField("tensor_type"):
            elem = tt.tensor_type.elem_type
            if elem:
                vi.type.tensor_type.elem_type = elem
        have.add(t)
    return m

