"""ORT's optimized graph mapped back to the original nodes, by tensor names
(fused nodes keep the output names of the last node they replace)."""

from __future__ import annotations

from typing import Collection, Optional

import onnx

from bisect_tui.core.graph import GraphIndex, node_io, topo_order
from bisect_tui.core.onnx_files import ensure_named as _ensure_named
from bisect_tui.api import FusedNode
from bisect_tui.engines.ort.passes import TOKEN_SUFFIX_RE, optimizer_tags

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


_ORIGINAL: list = []  # [(the model object given, its size, (named, index, name sets, memo))], newest last
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
    entry = (named, oidx, set(oidx.producer) | {i.name for i in og.input} | oidx.initializers, set(oidx.by_name), {})
    kept = [e for e in _ORIGINAL if e[0] is not original] + [(original, size, entry)]
    while len(kept) > _ORIGINAL_KEPT:
        # the oldest of the smallest goes first: a round's four subgraph maps had pushed
        # out the whole model, indexed again for the next whole-graph map (0.2 s at 21,000 nodes)
        sizes = [len(e[2][1].nodes) for e in kept[:-1]]
        kept.pop(sizes.index(min(sizes)))
    _ORIGINAL[:] = kept
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
    original, oidx, orig_tensors, orig_names, per_original = _original_index(original)
    oprod = oidx.producer

    # Every field of the optimized graph's nodes is read once into plain lists
    # (a protobuf field read builds new objects each time), indexed by position.
    g = optimized.graph
    raw = list(g.node)
    names = [n.name for n in raw]
    ops = [n.op_type for n in raw]
    doms = [n.domain for n in raw]
    written, outs, nins = node_io(raw)  # inputs as written (a FusedNode's), outputs, node_inputs

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
    for k, op in enumerate(ops):
        if op == "Cast":
            n_out, n_in = outs[k], written[k]
            if (len(n_out) == 1 and n_out[0] in graph_outs and n_in
                    and n_in[0] and n_in[0] not in orig_tensors):
                survivor_alias[n_in[0]] = n_out[0]
    signatures = per_original.get("signatures")
    if signatures is None:
        signatures = per_original["signatures"] = _signatures(oidx)
    for k, name in enumerate(names):
        sig = signatures.get(name)
        if sig is None or sig[0] != ops[k] or sig[1] != doms[k]:
            continue
        o_out = sig[2]
        n_out = outs[k]
        if n_out == o_out or len(o_out) != len(n_out):
            continue  # the same outputs are original tensors already
        for new_t, old_t in zip(n_out, o_out):
            if new_t and old_t and new_t not in orig_tensors:
                survivor_alias.setdefault(new_t, old_t)

    # NchwcTransformer names each blocked-layout node `<original output>_nchwc`;
    # its (new) output holds that original tensor's values in NCHWc layout.
    # Without this the whole convolution trunk between ReorderInput and
    # ReorderOutput would collapse into one "fused node" at level "all".
    for k, dom in enumerate(doms):
        if dom != "com.microsoft.nchwc" or sum(1 for o in outs[k] if o) != 1:
            continue
        base = TOKEN_SUFFIX_RE.sub("", names[k])
        for prefix in _ALIAS_PREFIXES:
            if base.startswith(prefix):
                base = base[len(prefix):]
        if base.endswith("_nchwc") and base[: -len("_nchwc")] in oprod:
            out = outs[k][0]
            if out not in orig_tensors:
                survivor_alias.setdefault(out, base[: -len("_nchwc")])

    def canon(t: str) -> Optional[str]:
        if t in orig_tensors:
            return t
        if t.startswith(_ALIAS_PREFIXES):
            for prefix in _ALIAS_PREFIXES:
                if t.startswith(prefix) and t[len(prefix):] in orig_tensors:
                    return t[len(prefix):]
        return survivor_alias.get(t)

    available = {i.name for i in g.input} | {i.name for i in g.initializer} | {
        i.values.name for i in g.sparse_initializer
    }
    # from here on, position k is the k-th node in topological order
    order = topo_order(nins, outs, available)
    if order != list(range(len(order))):
        names = [names[k] for k in order]
        ops = [ops[k] for k in order]
        doms = [doms[k] for k in order]
        written = [written[k] for k in order]
        outs = [outs[k] for k in order]
        nins = [nins[k] for k in order]
    producer: dict[str, int] = {}
    for k, n_out in enumerate(outs):
        for o in n_out:
            if o:
                producer[o] = k
    # the glue walked through only matters by its last compute node (see below)
    compute_at = [k if op not in _LAYOUT_OPS else -1 for k, op in enumerate(ops)]

    # tensor -> (original boundary tensors, highest position of a compute node
    # among the glue nodes walked through, -1 if none). Original tensors are
    # their own boundary and are never stored: no lookup depends on them.
    empty: frozenset[str] = frozenset()
    no_glue = (empty, -1)
    memo: dict[str, tuple[frozenset[str], int]] = {}

    def resolve(tensor: str) -> tuple[frozenset[str], int]:
        if tensor not in producer:  # the walk's first step, without the walk
            c = canon(tensor)
            r = memo[tensor] = (frozenset((c,)), -1) if c is not None else no_glue
            return r
        # iterative post-order walk: optimized graphs can be deep. An entry is
        # (tensor, -1) until expanded, then (tensor, its producer's position).
        stack: list[tuple[str, int]] = [(tensor, -1)]
        on_stack: set[str] = set()
        while stack:
            t, k = stack.pop()
            if t in memo:
                continue
            if k < 0:
                c = canon(t)
                if c is not None:
                    memo[t] = (frozenset((c,)), -1)
                    continue
                k = producer.get(t, -1)
                if k < 0:  # a new initializer / input: no original twin, no work
                    memo[t] = no_glue
                    continue
                if t in on_stack:  # cycle guard (invalid graph); treat as a dead end
                    memo[t] = (empty, compute_at[k])
                    continue
                on_stack.add(t)
                stack.append((t, k))
                for i in nins[k]:
                    if i not in memo and i not in orig_tensors:
                        stack.append((i, -1))
                continue
            # the union of the inputs' boundaries (one input's set is shared, not copied)
            bound: Optional[frozenset[str]] = None
            merged: Optional[set[str]] = None
            top = compute_at[k]
            for i in nins[k]:
                if i in orig_tensors:
                    if merged is None:
                        merged = set(bound) if bound is not None else set()
                    merged.add(i)
                    continue
                b, gl = memo.get(i, no_glue)
                if gl > top:
                    top = gl
                if not b:
                    continue
                if merged is not None:
                    merged |= b
                elif bound is None:
                    bound = b
                elif b is not bound:
                    merged = set(bound)
                    merged |= b
            memo[t] = (frozenset(merged) if merged is not None else bound or empty, top)
        return memo[tensor]

    originals: dict[int, set[str]] = {}
    extra_tags: dict[int, list[str]] = {}
    # node name -> tags, for maps against this original (the same fused names
    # recur build after build); only for a hashable, unchangeable `known_optimizers`
    tag_memo = per_original.setdefault("tags", {}) if isinstance(known_optimizers, frozenset) else None
    o_inputs = oidx.inputs
    for k, n_out in enumerate(outs):
        ins = nins[k]
        if len(n_out) == 1 and n_out[0] in oprod:
            found = n_out
            p = oprod[n_out[0]]
            if o_inputs.get(p) == ins and n_out[0] not in ins and orig_tensors.issuperset(ins):
                # the common case, a node left as it was: the walk below would
                # reach the output's original producer and stop at its inputs
                originals.setdefault(k, set()).add(p)
                continue
        else:
            found = []
            for o in n_out:
                if o:
                    c = o if o in orig_tensors else canon(o)
                    if c is not None and c in oprod:
                        found.append(c)
            if not found:
                continue
        top = -1
        if orig_tensors.issuperset(ins):  # what resolve gives each, without the walk
            boundary = set(ins)
        else:
            boundary = set()
            for i in ins:
                if i in orig_tensors:
                    boundary.add(i)
                    continue
                r = memo.get(i)
                if r is None:
                    r = resolve(i)
                if r[0]:
                    boundary |= r[0]
                if r[1] > top:
                    top = r[1]
        covered = oidx.ancestor_set(found, boundary)
        if not covered:
            continue
        rep = k
        if top >= 0 and ops[k] in _LAYOUT_OPS and not (len(covered) == 1 and names[k] in covered):
            rep = top  # the last compute node among the glue walked through
            extra_tags.setdefault(rep, []).extend(_tags_of(names[k], orig_names, known_optimizers, tag_memo))
        have = originals.get(rep)
        if have is None:
            originals[rep] = covered
        else:
            have |= covered

    position = oidx.order.__getitem__
    result: list[FusedNode] = []
    for k, name in enumerate(names):
        tags = [] if name in orig_names else list(_tags_of(name, orig_names, known_optimizers, tag_memo))
        extra = extra_tags.get(k)
        if extra:
            for t in extra:
                if t not in tags:
                    tags.append(t)
        covered = originals.get(k)
        result.append(
            FusedNode(
                name=name,
                op_type=ops[k],
                domain=doms[k],
                inputs=written[k],
                outputs=outs[k],
                original_nodes=(sorted(covered, key=position) if len(covered) > 1 else list(covered))
                if covered else [],
                passes=tags,
            )
        )
    return result


def _signatures(oidx: GraphIndex) -> dict[str, tuple[str, str, list[str]]]:
    """Original node name -> (op, domain, outputs), read once per original index
    (the survivor rule compares every optimized node with its namesake)."""
    io = oidx.io_by_name()
    return {name: (n.op_type, n.domain, io[name][1]) for name, n in oidx.by_name.items()}


def _tags_of(name: str, orig_names: set, known: Collection[str], memo: Optional[dict]) -> tuple:
    """The optimizer tags of optimized node `name` (pure for given original
    names and `known`, so kept in `memo` when there is one)."""
    if memo is not None:
        key = (name, known)
        tags = memo.get(key)
        if tags is None:
            if len(memo) >= 200_000:
                memo.clear()
            tags = memo[key] = _tags_of(name, orig_names, known, None)
        return tags
    if name in orig_names:  # an original node left as it was
        return ()
    # don't read tags out of the original node name the fused one starts with
    head = name
    while "/" in head:
        head = head.rsplit("/", 1)[0]
        if head in orig_names:
            name = name[len(head):]
            break
    return tuple(optimizer_tags(name, known))
