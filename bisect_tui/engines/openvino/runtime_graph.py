"""OpenVINO's runtime graph read back in the original graph's words: which
original nodes each executed layer covers, and the precision it runs.

The executed graph is `compiled.get_runtime_model()`; each op's rt_info holds
`layerType` and `originalLayersNames` (node names, sometimes the name of a
graph output tensor). The list can be incomplete when a pattern was replaced
early (a whole normalization turned into one MVN), so nodes the list misses
are mapped by topology: an original node whose every consumer lies in one
layer belongs to that layer.
"""

from __future__ import annotations

from bisect_tui.api import FusedNode

_FROM_TYPE = {"f32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16", "f16": "fp16",
              "float16": "fp16"}
# runtime-graph layers that are plumbing, never a fused computation
_PLUMBING = frozenset({"Input", "Parameter", "Const", "Output", "Result", "Reorder"})



def precision_name(value) -> str:
    """OpenVINO's element type (Type, or its text) in the project's words."""
    text = getattr(value, "get_type_name", lambda: str(value))()
    text = str(text).strip().strip("<>").replace("Type:", "").strip().strip("'")
    return _FROM_TYPE.get(text, text)


# --------------------------------------------------------------------------- runtime graph


def runtime_layers(compiled) -> list[dict]:
    """The executed graph as plain records: name, layer type, original names,
    producer layers, runtime precision. JSON-able (kept next to each build)."""
    ops = compiled.get_runtime_model().get_ordered_ops()
    rows = []
    for op in ops:
        info = op.get_rt_info()

        def get(key: str) -> str:
            try:
                return str(info[key].astype(str))
            except Exception:
                return ""

        names = [n.strip() for n in get("originalLayersNames").split(",") if n.strip()]
        rows.append({
            "name": op.get_friendly_name(),
            "type": get("layerType"),
            "original": names,
            "inputs": [i.get_source_output().get_node().get_friendly_name() for i in op.inputs()],
            "precision": get("runtimePrecision"),
        })
    return rows


def fused_node_map(original, layers: list[dict], allow_shared: bool = False) -> list[FusedNode]:
    """Map each runtime layer to the original ONNX nodes it computes.

    Three sources, because `originalLayersNames` alone is incomplete:

    1. the names list (a node name, or a graph-output tensor name standing for
       its producer);
    2. tensors and topology: a layer computes everything between the tensors
       its producer layers hand it and the outputs of its named nodes, so the
       original graph is walked back from those outputs to that boundary (a
       normalization collapsed into one MVN names only its last node, but
       takes the normalization's input);
    3. for nodes still unowned, walking the original graph backwards: a node
       whose every consumer belongs to one layer is part of that layer.

    Nodes computed from constants only were folded at load and belong to no
    layer. With `allow_shared` a node may belong to several layers (a marked
    build can compute a node twice: once for the extra output, once inside a
    fusion), which is what `fusions_across` needs."""
    from bisect_tui.core.graph import GraphIndex

    idx = GraphIndex.build(original)
    by_name = idx.by_name
    constant = _folded_nodes(idx)
    graph_ins = set(idx.graph_inputs)
    graph_outs = set(idx.graph_outputs)
    owner: dict[str, int] = {}
    covered: list[list[str]] = []
    kept: list[dict] = []
    hands: dict[str, list[str]] = {}  # layer name -> original tensors it hands on
    for layer in layers:
        fed: list[str] = []
        for src in layer["inputs"]:
            for t in hands.get(src, []):
                if t not in fed:
                    fed.append(t)
        if layer["type"] in ("Input", "Parameter"):
            hands[layer["name"]] = [t for t in [layer["name"], *layer["original"]] if t in graph_ins][:1]
            continue
        if layer["type"] in _PLUMBING:
            hands[layer["name"]] = fed  # a reorder hands on what it was given
            continue
        named: list[str] = []
        for nm in layer["original"]:
            node = nm if nm in by_name else idx.producer.get(nm)
            if node and node not in named and node not in constant:
                named.append(node)
        if not named:
            hands[layer["name"]] = fed
            continue
        stop = set(fed) | idx.initializers | graph_ins
        nodes = list(named)
        todo = [t for n in named for t in by_name[n].input if t]
        while todo:
            t = todo.pop()
            if t in stop:
                continue
            stop.add(t)
            prod = idx.producer.get(t)
            if prod is None or prod in nodes or prod in constant:
                continue
            if not allow_shared and prod in owner:
                continue
            nodes.append(prod)
            todo.extend(i for i in by_name[prod].input if i)
        if not allow_shared:
            nodes = [n for n in nodes if n not in owner]
        k = len(kept)
        kept.append(layer)
        covered.append(nodes)
        for n in nodes:
            owner.setdefault(n, k)
        inside = set(nodes)
        hands[layer["name"]] = [t for n in nodes for t in by_name[n].output if t and (
            t in graph_outs or any(c not in inside for c in idx.consumers.get(t, [])))]
    for node in reversed(idx.nodes):
        name = node.name
        if name in owner or name in constant:
            continue
        if any(o in graph_outs for o in node.output if o):
            continue
        homes = {owner.get(c) for o in node.output if o for c in idx.consumers.get(o, [])}
        if len(homes) == 1 and None not in homes:
            k = homes.pop()
            owner[name] = k
            covered[k].append(name)
    out: list[FusedNode] = []
    for layer, nodes in zip(kept, covered):
        if not nodes:
            continue
        nodes = sorted(set(nodes), key=lambda n: idx.order.get(n, 0))
        inside = set(nodes)
        produced = [t for n in nodes for t in by_name[n].output if t]
        outs = [t for t in produced if t in graph_outs or any(c not in inside for c in idx.consumers.get(t, []))]
        ins: list[str] = []
        for n in nodes:
            for i in by_name[n].input:
                if i and i not in produced and i not in ins:
                    ins.append(i)
        out.append(FusedNode(name=layer["name"], op_type=layer["type"], domain="openvino",
                             inputs=ins, outputs=outs or produced[-1:], original_nodes=nodes))
    return out


def _folded_nodes(idx) -> set[str]:
    """Original nodes computed from constants only (OpenVINO folds them at load)."""
    const = set(idx.initializers)
    folded: set[str] = set()
    for node in idx.nodes:
        ins = [i for i in node.input if i]
        if node.op_type == "Constant" or (ins and all(i in const for i in ins)):
            folded.add(node.name)
            const.update(o for o in node.output if o)
    return folded


def interior_tensors(fn: FusedNode, original) -> set[str]:
    """Tensors a fused layer computes and consumes inside itself."""
    from bisect_tui.core.graph import GraphIndex

    idx = GraphIndex.build(original)
    inside = set(fn.original_nodes)
    return {t for n in fn.original_nodes for t in idx.by_name[n].output
            if t and all(c in inside for c in idx.consumers.get(t, [])) and t not in idx.graph_outputs}


# --------------------------------------------------------------------------- built
