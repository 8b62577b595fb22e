"""A suspect judged on its own subgraph instead of a whole-graph build.

"This fused node alone breaks tolerance" is, on the whole graph, one engine
build with every other fusion blocked: everything but the suspect then runs
the unfused kernels, whose values are the baseline's (the search's "all
fusions blocked" step shows it). The same question costs far less as:

1. the suspect's original nodes extracted as a model, fed the baseline's own
   tensors, built and run through the engine under test (a build of a few
   nodes, not thousands: on an engine whose builds take minutes, seconds);
2. the rest of the graph run unfused (the triage's unfused reference, as the
   baseline) from the suspect's fused outputs to the model's outputs;
3. the model's outputs judged at the user's tolerance, like any step.

It stands for the whole-graph build only where the engine's result there is
the same as in the whole graph: the engine must fuse the extracted nodes into
the same single fused node (same op, same original nodes) it made in the
whole graph. Anything else (a different fusion, a build or run error, an
engine that keeps no fused-node map) returns None and the caller builds the
whole graph as before.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import numpy as np
import onnx
from onnx import helper

from bisect_tui.core.baseline_store import load_tensor, reference_output
from bisect_tui.core.bisect.isolate import extract_subgraph, value_types as _value_types
from bisect_tui.core.bisect.units import Unit
from bisect_tui.core.graph import node_inputs
from bisect_tui.core.errors import EngineBuildError, EnvironmentFault, UserError
from bisect_tui.core.external_data import write_beside


def value_types(t) -> dict[str, tuple[str, list[int]]]:
    """isolate.value_types, read once per baseline: each suspect asks twice (its subgraph,
    its downstream run), each fixpoint round again, and at 21,000 tensors it is a walk of
    the whole manifest. Read-only for every caller."""
    memo = vars(t).setdefault("_value_types", {})
    key = (t.baseline.manifest.get("key"), id(t.inputs))
    if key not in memo:
        memo.clear()
        memo[key] = _value_types(t)
    return memo[key]


class GraphRows:
    """A model's nodes as plain lists (name, inputs as node_inputs gives them,
    non-empty outputs), and its initializer, input and value_info names, read
    once: downstream_model walks every node for every suspect, and reading
    NodeProto fields costs ~2 us each (0.15 s a call at 21,000 nodes). `index`
    (the model's GraphIndex) lends its inputs when its node names are unique."""

    def __init__(self, model: onnx.ModelProto, index=None):
        g = model.graph
        self.model = model
        self.n_nodes = len(g.node)
        self.nodes = list(g.node)
        self.names = [n.name for n in self.nodes]
        known = getattr(index, "inputs", None)
        if (known is None or len(known) != len(self.names) or len(set(self.names)) != len(self.names)
                or len(getattr(index, "nodes", ())) != len(self.names)):
            known = None
        self.inputs = [known[name] if known is not None and name in known else node_inputs(n)
                       for n, name in zip(self.nodes, self.names)]
        self.outputs = [[o for o in n.output if o] for n in self.nodes]
        self.inits = {i.name for i in g.initializer}
        self.graph_inputs = {i.name for i in g.input}
        self.value_info = [v.name for v in g.value_info]
        self._sorted: dict = {}
        self.shape = self._shape(g)

    def _shape(self, g) -> tuple:
        return len(g.node), len(g.initializer), len(g.input), len(g.value_info)

    def fits(self, model: onnx.ModelProto) -> bool:
        """Still this model, as read (a model changed since is read again)."""
        return model is self.model and self._shape(model.graph) == self.shape

    def positions(self, order: Optional[dict[str, int]]) -> list[int]:
        """The nodes' positions sorted by `order` (stable), as downstream_model sorts them."""
        key = None if order is None else (id(order), len(order))
        hit = self._sorted.get(key)
        if hit is None or hit[0] is not order:
            ks = list(range(self.n_nodes))
            if order is not None:
                names = self.names
                ks.sort(key=lambda k: order.get(names[k], 1 << 30))
            if len(self._sorted) > 4:  # one order per model in practice
                self._sorted.clear()
            hit = self._sorted[key] = (order, ks)
        return hit[1]


def graph_rows(t) -> GraphRows:
    """GraphRows of the triage's model, kept on the triage while its model is the same."""
    store = getattr(t, "__dict__", {})  # a triage without one: read each time
    rows = store.get("_graph_rows")
    if rows is None or not rows.fits(t.info.model):
        rows = store["_graph_rows"] = GraphRows(t.info.model, getattr(t.info, "index", None))
    return rows


def downstream_model(model: onnx.ModelProto, unit: Unit,
                     types: dict[str, tuple[str, list[int]]],
                     order: Optional[dict[str, int]] = None,
                     rows: Optional[GraphRows] = None) -> onnx.ModelProto:
    """The nodes downstream of the suspect only (those that read one of its
    outputs, directly or through each other), with the suspect's outputs and
    every tensor they read from upstream fed in as graph inputs. Run unfused it
    carries the suspect's values to the outputs; upstream tensors take the
    baseline's values, which is what upstream computes in the build it stands
    for (every other fusion blocked) and what running it again gave (the
    baseline is deterministic) at the cost of a session of the whole model.
    `rows`: the model's GraphRows, when the caller keeps them (graph_rows)."""
    if rows is None or not rows.fits(model):
        rows = GraphRows(model)
    region = set(unit.original_nodes)
    graph_inputs = rows.graph_inputs
    feeds = [t for t in unit.outputs if t not in graph_inputs]
    names, inputs, outputs = rows.names, rows.inputs, rows.outputs
    tainted = set(unit.outputs)
    kept: list[int] = []
    for k in rows.positions(order):
        if names[k] in region:
            continue
        if not tainted.isdisjoint(inputs[k]):
            kept.append(k)
            tainted.update(outputs[k])
    produced = {o for k in kept for o in outputs[k]}
    inits = rows.inits
    fed_already = set(feeds)
    upstream = list(dict.fromkeys(
        i for k in kept for i in inputs[k]
        if i not in produced and i not in inits and i not in graph_inputs and i not in fed_already))
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    del g.node[:]
    g.node.extend([rows.nodes[k] for k in kept])
    # only the weights the kept nodes read: ORT took every unused one out again, one
    # by one (0.39-0.63 CPU-s a session of the 7,800 nodes below blk877 at 21,000
    # nodes, with the model's 11,200 initializers; an IR-3 model lists them as inputs too)
    read = {i for k in kept for i in inputs[k]}
    if len(read & inits) < len(inits):
        weights = [t for t in g.initializer if t.name in read]
        del g.initializer[:]
        g.initializer.extend(weights)
        dropped = inits - read
        declared = [i for i in g.input if i.name not in dropped]
        if len(declared) < len(g.input):
            del g.input[:]
            g.input.extend(declared)
    fed = set(feeds) | set(upstream)
    for k in reversed([k for k, name in enumerate(rows.value_info) if name in fed]):
        del g.value_info[k]  # the rest as they were, in their order
    outs = [o for o in g.output if o.name in produced]
    del g.output[:]
    g.output.extend(outs)
    for t in feeds + upstream:
        dtype, shape = types[t]
        g.input.append(helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
    return m


def same_fusion(unit: Unit, fused_nodes) -> bool:
    """The extracted nodes became exactly the suspect's fused node."""
    fused = [f for f in fused_nodes if f.is_fused]
    return (len(fused) == 1 and fused[0].op_type == unit.op_type
            and sorted(fused[0].original_nodes) == sorted(unit.original_nodes))


def write_subgraph(t, unit: Unit, out_dir: Path) -> Optional[tuple[Path, list[str]]]:
    """The suspect's original nodes as a model in `out_dir/subgraph.onnx`, and the
    tensors it reads (fed from the baseline); None when they cannot be extracted."""
    types = value_types(t)
    if not unit.outputs or not unit.original_nodes or any(o not in types for o in unit.outputs):
        return None
    try:
        sub, sub_inputs = extract_subgraph(t.info.model, list(unit.original_nodes), list(unit.outputs), types)
    except (KeyError, ValueError):
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    sub_path = out_dir / "subgraph.onnx"
    write_beside(sub, sub_path)  # external data: linked beside it
    return sub_path, list(sub_inputs)


def subgraph_file(t, unit: Unit) -> Optional[Path]:
    """The unit's subgraph where the subgraph check writes it, or None."""
    written = write_subgraph(t, unit, t.session.bisect_dir / "subgraphs" / f"unit_{unit.index}")
    return written[0] if written else None


def suspect_on_subgraph(bis, unit: Unit, config, out_dir: Path) -> Optional[dict]:
    """The suspect's own fusion, judged on the model's outputs without a
    whole-graph build: {"judgement", "seconds", "fused_node"}; None when the
    subgraph cannot stand for the whole graph (see the module's docstring)."""
    t = bis.t
    if not unit.outputs or not unit.original_nodes:
        return None
    t0 = time.perf_counter()
    types = value_types(t)
    written = write_subgraph(t, unit, out_dir)
    if written is None:
        return None
    sub_path, sub_inputs = written

    def baseline(name: str) -> np.ndarray:
        if name in t.inputs.arrays:
            return np.asarray(t.inputs.arrays[name])
        return np.asarray(load_tensor(t.session, t.baseline.manifest, name))

    try:
        stacked = {i: baseline(i) for i in sub_inputs}
    except KeyError:
        return None
    try:
        built = bis.engine.build(sub_path, config, (), None)
    except EnvironmentFault:
        raise
    except (EngineBuildError, UserError):
        return None
    try:
        try:
            fused_nodes = list(built.fused_nodes)
        except Exception:  # noqa: BLE001 (an engine without a map cannot prove equivalence)
            return None
        if not same_fusion(unit, fused_nodes):
            return None
        region_out = [built.run({i: np.ascontiguousarray(a[k]) for i, a in stacked.items()})
                      for k in range(t.inputs.samples)]
    except EngineBuildError:
        return None
    finally:
        built.close()
    from bisect_tui.core.reference import UnfusedModel

    try:
        down = downstream_model(t.info.model, unit, types, t.info.index.order, graph_rows(t))
    except KeyError:
        return None  # an upstream tensor of unknown type (not in the baseline)
    rest = UnfusedModel(t.reference, down) if len(down.graph.node) else None
    own = set(unit.outputs) | {i.name for i in t.info.model.graph.input}
    upstream = [i.name for i in down.graph.input if i.name not in own]
    names = list(t.info.outputs)
    computed = [o.name for o in down.graph.output]
    try:
        up = {i: baseline(i) for i in upstream}
        unchanged = {n: reference_output(t.info, t.session, t.baseline.manifest, t.inputs, n)
                     for n in names if n not in computed and n not in unit.outputs}
    except KeyError:
        return None
    per_sample = []
    for k in range(t.inputs.samples):
        t.cancel.check()
        feeds = {**t.inputs.feeds(k), **{o: np.asarray(region_out[k][o]) for o in unit.outputs},
                 **{i: np.ascontiguousarray(a[k]) for i, a in up.items()}}
        outs = rest.run(feeds, computed) if rest is not None and computed else {}
        for name in names:
            if name not in outs and name in feeds:
                outs[name] = feeds[name]  # a model output the suspect itself produces
            elif name not in outs and name in unchanged:
                outs[name] = np.asarray(unchanged[name][k])  # not downstream of the suspect: the baseline's
        per_sample.append({n: outs[n] for n in names})
    return {"judgement": bis.judge.judge(per_sample), "seconds": time.perf_counter() - t0,
            "fused_node": unit.fused_node}
