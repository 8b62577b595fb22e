"""ORT's optimized graph mapped back to the original nodes, by tensor names
(fused nodes keep the output names of the last node they replace)."""

from __future__ import annotations

from typing import Collection, Optional

import onnx

from bisect_tui.core.graph import GraphIndex, toposort_with_inputs
from bisect_tui.core.onnx_files import ensure_named as _ensure_named
from bisect_tui.api import FusedNode
from bisect_tui.engines.ort.passes import _TOKEN_SUFFIX_RE, optimizer_tags

# Prefixes ORT puts in front of a tensor name when it makes a copy of the same
# values in another precision (the CPU provider runs most fp16 ops in fp32 and
# inserts casts: `InsertedCast_` up to ~1.2x, `InsertedPrecisionFreeCast_`
# later; constant casts are folded into `FusedBack_` initializers). Such a
# tensor *is* the original tensor for the map.
_ALIAS_PREFIXES = ("InsertedPrecisionFreeCast_", "InsertedCast_", "FusedBack_")

# Ops that only move/relabel data. When one of them ends a cluster of
# optimizer-made nodes (e.g. Reshape -> Gemm -> Reshape from MatMulAddFusion on
# 3-D inputs) the compute node in the cluster is what the user should see as
# "the fused node", so it inherits the cluster's original nodes.
_LAYOUT_OPS = frozenset(
    {
        "Cast",
        "CastLike",
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Identity",
        "Flatten",
        "ReorderInput",
        "ReorderOutput",
    }
)


_ORIGINAL: list = []  # [(the model object given, its size, its index and name sets)], newest last
_ORIGINAL_KEPT = 4  # the whole model and the few subgraphs a search maps against in turn


def _original_index(original: onnx.ModelProto) -> tuple:
    """The original graph's index, kept while the same (unchanged) model object is
    given again: the engine hands the same object for every build of a search,
    and a subgraph check or isolation in between must not push it out.
    Read-only here, so reuse is safe; any other object is indexed afresh."""
    size = original.ByteSize()
    for k, (obj, obj_size, entry) in enumerate(_ORIGINAL):
        if obj is original and obj_size == size:
            _ORIGINAL.append(_ORIGINAL.pop(k))
            return entry
    named = _ensure_named(original)
    return adopt_original(original, named, GraphIndex.build(named), size)


def adopt_original(original: onnx.ModelProto, named: onnx.ModelProto, oidx: GraphIndex,
                   size: Optional[int] = None) -> tuple:
    """Keep `oidx` (built from `named`, `original` with every node named) as the
    index of `original`: the checklist indexes the model it prepares anyway, and
    the first map of a 5,000-node model spent a tenth of a second indexing it again."""
    size = original.ByteSize() if size is None else size
    og = named.graph
    entry = (named, oidx, set(oidx.producer) | {i.name for i in og.input} | oidx.initializers, set(oidx.by_name))
    _ORIGINAL[:] = [e for e in _ORIGINAL if e[0] is not original][-(_ORIGINAL_KEPT - 1):] + [(original, size, entry)]
    return entry


def fused_node_map(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    known_optimizers: Collection[str],
) -> list[FusedNode]:
    """Map every node of ORT's optimized graph to the original nodes it replaced.

    Mapping is by tensor names because ORT keeps the output tensor names of the
    last original node of a fused pattern and takes the pattern's external
    inputs. For an optimized node N:

    * its *boundary* is its inputs, where an input that does not exist in the
      original graph (an optimizer-made tensor such as `reorder_token_*`,
      `*_reshape_arg`, fp16 cast outputs) is resolved by walking back through
      the optimized graph's producers until original tensors are reached;
    * its original nodes are those reached walking back in the ORIGINAL graph
      from N's output tensors that exist there, stopping at the boundary
      (initializers and graph inputs are never nodes).

    A node whose outputs are all new tensors is glue and gets [] - its work is
    counted by the consumer that exposes an original tensor. One refinement:
    when that consumer is a pure layout op (Reshape/Cast/...) and the glue
    walked through contains a compute node (the Gemm of a Reshape-Gemm-Reshape
    MatMulAddFusion, the real op behind an fp16 output Cast), the compute node
    takes the original nodes, so the user sees "Gemm covers MatMul+Add".

    Tensors renamed by ORT's fp16 handling (`InsertedPrecisionFreeCast_X`,
    `InsertedCast_X`, `FusedBack_X`) stand for X, and so do renamed outputs of
    a node that kept its name, op and domain. Result is in the optimized graph's topological
    order."""
    original, oidx, orig_tensors, orig_names = _original_index(original)

    g = optimized.graph
    # A node ORT left as it was keeps its name, op and domain; if its outputs
    # were renamed anyway (cast insertion with a prefix this code doesn't know)
    # they are still that node's original outputs.
    survivor_alias: dict[str, str] = {}
    # The fp16 converter (keep_io_types) ends each graph output with a Cast back
    # to float32; what feeds that Cast holds the graph output's values. This
    # wins over the name rule below: a node that kept its name may have been
    # rewired to produce another node's output (ConvBNFusion keeps the Conv and
    # gives it the BatchNormalization's output).
    graph_outs = set(oidx.graph_outputs)
    for n in g.node:
        if (n.op_type == "Cast" and len(n.output) == 1 and n.output[0] in graph_outs and n.input
                and n.input[0] and n.input[0] not in orig_tensors):
            survivor_alias[n.input[0]] = n.output[0]
    for n in g.node:
        o = oidx.by_name.get(n.name)
        if o is None or o.op_type != n.op_type or o.domain != n.domain or len(o.output) != len(n.output):
            continue
        for new_t, old_t in zip(n.output, o.output):
            if new_t and old_t and new_t not in orig_tensors:
                survivor_alias.setdefault(new_t, old_t)

    # NchwcTransformer names each blocked-layout node `<original output>_nchwc`;
    # its (new) output holds that original tensor's values in NCHWc layout.
    # Without this the whole convolution trunk between ReorderInput and
    # ReorderOutput would collapse into one "fused node" at level "all".
    for n in g.node:
        if n.domain != "com.microsoft.nchwc" or len([o for o in n.output if o]) != 1:
            continue
        base = _TOKEN_SUFFIX_RE.sub("", n.name)
        for prefix in _ALIAS_PREFIXES:
            if base.startswith(prefix):
                base = base[len(prefix):]
        if base.endswith("_nchwc") and base[: -len("_nchwc")] in oidx.producer:
            out = n.output[0]
            if out not in orig_tensors:
                survivor_alias.setdefault(out, base[: -len("_nchwc")])

    def canon(t: str) -> Optional[str]:
        if t in orig_tensors:
            return t
        for prefix in _ALIAS_PREFIXES:
            if t.startswith(prefix) and t[len(prefix):] in orig_tensors:
                return t[len(prefix):]
        return survivor_alias.get(t)

    available = {i.name for i in g.input} | {i.name for i in g.initializer} | {
        i.values.name for i in g.sparse_initializer
    }
    nodes, node_ins = toposort_with_inputs(list(g.node), available)
    producer: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = k

    # tensor -> (original boundary tensors, indices of glue nodes walked through)
    memo: dict[str, tuple[frozenset[str], frozenset[int]]] = {}

    def resolve(tensor: str) -> tuple[frozenset[str], frozenset[int]]:
        if tensor in memo:
            return memo[tensor]
        # iterative post-order walk: optimized graphs can be deep
        stack: list[tuple[str, bool]] = [(tensor, False)]
        on_stack: set[str] = set()
        while stack:
            t, expanded = stack.pop()
            if t in memo:
                continue
            c = canon(t)
            if c is not None:
                memo[t] = (frozenset({c}), frozenset())
                continue
            k = producer.get(t)
            if k is None:  # a new initializer / input: no original twin, no work
                memo[t] = (frozenset(), frozenset())
                continue
            ins = node_ins[k]
            if not expanded:
                if t in on_stack:  # cycle guard (invalid graph); treat as a dead end
                    memo[t] = (frozenset(), frozenset({k}))
                    continue
                on_stack.add(t)
                stack.append((t, True))
                stack.extend((i, False) for i in ins if i not in memo)
                continue
            bound: set[str] = set()
            glue: set[int] = {k}
            for i in ins:
                b, gl = memo.get(i, (frozenset(), frozenset()))
                bound |= b
                glue |= gl
            memo[t] = (frozenset(bound), frozenset(glue))
        return memo[tensor]

    originals: dict[int, set[str]] = {}
    extra_tags: dict[int, list[str]] = {}

    def tags_of(n: onnx.NodeProto) -> list[str]:
        if n.name in orig_names:  # an original node left as it was
            return []
        name = n.name
        # don't read tags out of the original node name the fused one starts with
        head = name
        while "/" in head:
            head = head.rsplit("/", 1)[0]
            if head in orig_names:
                name = name[len(head):]
                break
        return optimizer_tags(name, known_optimizers)

    for k, n in enumerate(nodes):
        outs = [c for c in (canon(o) for o in n.output if o) if c is not None]
        outs = [c for c in outs if c in oidx.producer]
        if not outs:
            continue
        boundary: set[str] = set()
        glue: set[int] = set()
        for i in node_ins[k]:
            b, gl = resolve(i)
            boundary |= b
            glue |= gl
        covered = oidx.ancestors_within(outs, boundary)
        if not covered:
            continue
        rep = k
        if n.op_type in _LAYOUT_OPS and covered != [n.name]:
            compute = [j for j in glue if nodes[j].op_type not in _LAYOUT_OPS]
            if compute:
                rep = max(compute)
                extra_tags.setdefault(rep, []).extend(tags_of(n))
        originals.setdefault(rep, set()).update(covered)

    result: list[FusedNode] = []
    for k, n in enumerate(nodes):
        tags = tags_of(n)
        for t in extra_tags.get(k, []):
            if t not in tags:
                tags.append(t)
        result.append(
            FusedNode(
                name=n.name,
                op_type=n.op_type,
                domain=n.domain,
                inputs=list(n.input),
                outputs=list(n.output),
                original_nodes=sorted(originals.get(k, ()), key=oidx.order.__getitem__),
                passes=tags,
            )
        )
    return result
