"""Marked builds of large graphs built as the graph's parts, one after the other.

Why: "all fusions blocked", the rest proofs and the bisection's trials are
whole-graph builds, and an engine's build cost can grow faster than the graph (one
engine's fusion names each node it adds by a search of every node:
docs/benchmarks.md, fourth pass). A marked tensor blocks every fusion across it, so
cutting the graph at a marked tensor where it alone carries all that the rest reads
from above (a separator) and building each part alone makes the same program in
pieces, each cheaper: 3.55 against 1.27 CPU-s for "all fusions blocked" at 21,000
nodes in 33 parts, 0.43 against 0.26 at 5,100 in 8, bit-identical outputs
(docs/benchmarks.md, sixth pass). Never at a tensor a fused node of the unmarked
map spans (the one fusion marking does not block keeps the marked tensor as its own
output), and only on engines that say the parts are the same program
(`Engine.builds_in_parts`). Each part is built, run on every sample and closed
before the next, so one part's session is alive at a time. A part the engine fails
on gives way to the whole graph: a verdict about the engine is made on the graph
the user runs.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import onnx

from bisect_tui.api import BuildContext
from bisect_tui.core.graph import GraphIndex

# about this many nodes a part; graphs under two parts' worth are built whole. The
# blocked build of the 21,000-node stack took 2.01, 1.70, 1.18 and 1.21 CPU-s in 4, 8,
# 32 and 64 parts (5,100 nodes: 0.36, 0.30 and 0.26 in 2, 4 and 8): the per-part cost
# stops falling at a few hundred nodes
PART_NODES = 640


def separators(index: GraphIndex) -> list[tuple[int, str]]:
    """(topological index, tensor) wherever one tensor carries all that the nodes
    below read from the nodes above (graph inputs are fed to every part that reads
    them, so an attention mask fed to every layer does not stand in the way)."""
    nodes = index.nodes
    uses: dict[str, int] = {}
    for n in nodes:
        for t in index.inputs.get(n.name, ()):
            if t in index.producer:
                uses[t] = uses.get(t, 0) + 1
    outs = set(index.graph_outputs)
    live: set[str] = set()
    seps: list[tuple[int, str]] = []
    for i, n in enumerate(nodes[:-1]):
        for t in index.inputs.get(n.name, ()):
            if t in uses:
                uses[t] -= 1
                if not uses[t] and t not in outs:
                    live.discard(t)
        live.update(o for o in n.output if o and (uses.get(o) or o in outs))
        if len(live) == 1:
            (t,) = live
            if t not in outs:
                seps.append((i, t))
    return seps


def plan_cuts(index: GraphIndex, part_nodes: Optional[int] = None, allowed=None,
              seps: Optional[list[tuple[int, str]]] = None) -> tuple[str, ...]:
    """Separators near every `part_nodes`-th node (among those `allowed` lets
    through), in topological order; () for a graph too small to gain or without
    separators."""
    size = part_nodes or PART_NODES
    n = len(index.nodes)
    if n < 2 * size:
        return ()
    cuts: list[str] = []
    want = size
    for i, t in separators(index) if seps is None else seps:
        if i + 1 >= want and n - (i + 1) >= size // 2 and (allowed is None or allowed(t)):
            cuts.append(t)
            want = i + 1 + size
    return tuple(cuts)


def split_nodes(index: GraphIndex, cuts: Sequence[str]) -> list[list[onnx.NodeProto]]:
    """The nodes of each part, in topological order: part k ends with the node that makes cuts[k]."""
    at = {index.producer[c]: k for k, c in enumerate(cuts)}
    parts: list[list[onnx.NodeProto]] = [[]]
    for n in index.nodes:
        parts[-1].append(n)
        if n.name in at:
            parts.append([])
    return parts


def part_model(model: onnx.ModelProto, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
                outputs: list[str], index: GraphIndex, inits_at: dict[str, list[int]]) -> onnx.ModelProto:
    """`inits_at`: the model's initializers by name, as their position in it: a
    part takes the ones it reads in the model's order, without a pass over all of
    them per part (0.56 CPU-s for 99 parts of the 21,000-node stack)."""
    used = {t for n in nodes for t in index.inputs.get(n.name, ())}
    every = model.graph.initializer
    return assemble_part(model, nodes, inputs, outputs,
                         [every[k] for k in sorted(k for t in used for k in inits_at.get(t, ()))])


def assemble_part(model: onnx.ModelProto, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
                  outputs: list[str], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    """`nodes` of `model` as a model of their own: its opsets, IR version and functions,
    `inits` its weights, `outputs` untyped (the session types each from its node)."""
    outs = [onnx.helper.make_value_info(o, onnx.TypeProto()) for o in outputs]
    graph = onnx.helper.make_graph(nodes, "part", inputs, outs, inits)
    part = onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    part.functions.extend(model.functions)
    return part


def triage_separators(triage) -> list[tuple[int, str]]:
    """separators() of the triage's model, kept on the triage: the search's cuts and the
    second run's plan ask for the same ones (0.05 CPU-s a walk at 21,000 nodes)."""
    seps = getattr(triage, "_part_separators", None)
    if seps is None:
        seps = triage._part_separators = separators(triage.info.index)
    return seps


_LOADED: dict[tuple, tuple[onnx.ModelProto, GraphIndex, dict[str, list[int]]]] = {}
CACHE_BYTES = 64 << 20  # a model up to this size is kept for the next parted build of the run


def _file_key(model_path) -> tuple:
    st = os.stat(model_path)
    return (os.path.realpath(model_path), st.st_size, st.st_mtime_ns)


def initializer_positions(model: onnx.ModelProto) -> dict[str, list[int]]:
    at: dict[str, list[int]] = {}
    for k, t in enumerate(model.graph.initializer):
        at.setdefault(t.name, []).append(k)
    return at


def know_model(model_path, model: onnx.ModelProto, index: GraphIndex) -> None:
    """`model` (indexed as `index`) is what the file at `model_path` holds now: the
    checklist has both in hand, and the first parted build read and indexed the
    21,000-node model again (0.4 CPU-s beside the check's own work)."""
    key = _file_key(model_path)
    if key[1] <= CACHE_BYTES:
        _LOADED.clear()
        _LOADED[key] = (model, index, initializer_positions(model))


def _loaded(model_path: str) -> tuple[onnx.ModelProto, GraphIndex, dict[str, list[int]]]:
    """The model, its index and its initializers' positions by name, read once per
    process for the builds of one run (each parted build read and indexed the
    21,000-node model again: 0.5-0.7 CPU-s)."""
    key = _file_key(model_path)
    got = _LOADED.get(key)
    if got is None:
        model = onnx.load(model_path)
        got = (model, GraphIndex.build(model), initializer_positions(model))
        if key[1] <= CACHE_BYTES:
            _LOADED.clear()
            _LOADED[key] = got
    return got


def typed_input(name: str, a: np.ndarray, shaped: bool = True) -> onnx.ValueInfoProto:
    """A part's input typed as the array it is fed (`shaped=False`: its element type
    only, for a part fed other shapes by other samples)."""
    return onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype),
                                              list(a.shape) if shaped else None)


_PART = BuildContext(map_wanted=False)  # a part's outputs are read, never its map


def run_parts(engine, model_path: str, feeds: Sequence[dict], job):
    """pool.build_and_run's work for a job with `cuts`: (the graph outputs of each
    sample, the number of parts); None when a part failed (the caller then builds
    the whole graph)."""
    from bisect_tui.api import EngineBuildError

    model, index, inits_at = _loaded(model_path)
    cuts = [c for c in job.cuts if c in index.producer]
    if len(cuts) != len(job.cuts):
        return None  # not this model's tensors: built whole
    parts = split_nodes(index, cuts)
    marks = set(job.marks)
    graph_inputs = {i.name: i for i in model.graph.input}
    tmp = Path(tempfile.mkdtemp(prefix="parts_"))  # the session's tmp (safepath.use_session_temp)
    carried: list[dict[str, np.ndarray]] = [dict(f) for f in feeds]  # per sample: what the next part reads
    final: list[dict[str, np.ndarray]] = []
    try:
        for k, nodes in enumerate(parts):
            last = k == len(parts) - 1
            reads = [t for n in nodes for t in index.inputs.get(n.name, ())]
            ins = [graph_inputs[t] for t in dict.fromkeys(reads) if t in graph_inputs]
            if k:
                ins.insert(0, typed_input(cuts[k - 1], carried[0][cuts[k - 1]]))
            outputs = list(index.graph_outputs) if last else [cuts[k]]
            part = part_model(model, nodes, ins, outputs, index, inits_at)
            path = tmp / f"part_{k}.onnx"
            # the bytes onnx.save writes, without its walk of every tensor for external
            # data (a model with external data is never cut: cuts_for)
            path.write_bytes(part.SerializeToString())
            mine = [o for n in nodes for o in n.output if o and o in marks and o not in outputs]
            try:
                built = engine.build(path, job.config, mine, None, context=replace(_PART, model=part))
            except EngineBuildError:
                return None
            try:
                names = {i.name for i in ins}
                outs = [built.run({n: v for n, v in f.items() if n in names}, outputs) for f in carried]
            except EngineBuildError:
                return None
            finally:
                built.close()
            if last:
                final = outs
            else:
                carried = [{**{n: v for n, v in f.items() if n in graph_inputs}, cuts[k]: o[cuts[k]]}
                           for f, o in zip(carried, outs)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, len(parts)


def cuts_for(triage, config, marks, units=None) -> tuple[str, ...]:
    """Where a build of `config` marking `marks` may be cut: at marked separators
    (a part's boundary is then a marked tensor either way) that no fused node of the
    unmarked engine of `config` spans (`units`: its map; a fusion that keeps a
    marked tensor as one of its own outputs, the one case marking does not block,
    is never cut). With every tensor marked no map is needed: nothing is left to
    fuse. () where the engine does not build such parts as one program."""
    engine = triage.engine
    caps = engine.capabilities
    info = triage.info
    if caps is None or not caps.marking_blocks or info is None or info.external or not marks:
        return ()
    if not getattr(engine, "builds_in_parts", lambda c: False)(config):
        return ()
    index = info.index
    # fixed input shapes: the engine then infers fixed shapes over the whole graph, as a
    # part reads them from its input (with a symbolic batch it could optimize a part
    # for the one size fed)
    if len(index.nodes) < 2 * PART_NODES or not all(s.is_static for s in info.inputs):
        return ()
    seps = triage_separators(triage)
    marked = set(marks)
    if len(marked) >= len(index.producer) and marked >= index.producer.keys():
        return plan_cuts(index, seps=seps)
    if units is None:
        return ()
    spanned = _spanned(triage, index, units)
    return plan_cuts(index, seps=seps, allowed=lambda t: t in marked and t not in spanned)


def _spanned(triage, index, units) -> frozenset[str]:
    """The tensors some fused node of `units` takes in as well as makes, kept for the
    last map asked: every trial of a search cuts against the same map (75 ms a call
    at 21,000 nodes)."""
    memo = getattr(triage, "_part_spanned", None)
    if memo is not None and memo[0] is units and memo[1] is index:
        return memo[2]
    spanned: set[str] = set()
    for u in units:
        inside = set(u.original_nodes)
        for nd in u.original_nodes:
            node = index.by_name.get(nd)
            for t in node.output if node is not None else ():
                if any(c in inside for c in index.consumers.get(t, ())):
                    spanned.add(t)
    triage._part_spanned = (units, index, frozenset(spanned))
    return triage._part_spanned[2]
