"""Which original nodes a pass changed: the engine's optimized graphs built with
and without it, compared node by node.

A pass that rewrites in place leaves no fused node to map, but it leaves a
node that differs (another op, other inputs or attributes) or a tensor that
became a constant. Nodes are matched by what they compute (domain, op,
inputs, outputs, attributes), so the names the engine gives them do not
matter; each differing node's original output tensors name the original
nodes that produced them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import onnx


def _signature(n: onnx.NodeProto) -> tuple:
    attrs = tuple(sorted((a.name, a.SerializeToString(deterministic=True)) for a in n.attribute))
    return (n.domain, n.op_type, tuple(n.input), tuple(n.output), attrs)


def _load(path) -> Optional[onnx.ModelProto]:
    try:
        m = onnx.load(str(Path(path)), load_external_data=False)
    except Exception:  # noqa: BLE001  (not an ONNX graph: another engine's runtime graph)
        return None
    # protobuf parses some other bytes (a JSON runtime graph) as an empty message
    return m if m.ir_version and m.graph.node else None


def changed_original_nodes(with_pass, without_pass, index) -> Optional[list[str]]:
    """Original node names whose computation differs between the two optimized
    graphs, in topological order; None when either is not an ONNX graph."""
    a, b = _load(with_pass), _load(without_pass)
    if a is None or b is None:
        return None
    sa = Counter(_signature(n) for n in a.graph.node)
    sb = Counter(_signature(n) for n in b.graph.node)
    touched: set[str] = set()
    for sig in list((sa - sb).keys()) + list((sb - sa).keys()):
        touched.update(t for t in sig[3] if t)
    inits_a = {i.name for i in a.graph.initializer}
    inits_b = {i.name for i in b.graph.initializer}
    touched.update(inits_a ^ inits_b)  # a folded constant, or one the pass no longer folds
    nodes = {index.producer[t] for t in touched if t in index.producer}
    return sorted(nodes, key=lambda n: index.order.get(n, 0))
