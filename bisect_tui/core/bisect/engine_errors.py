"""When the fused engine fails to build or to run: search where, not only say so.

A run that fails after a build still has an optimized graph to map: its fused
nodes are the search's units like those of a tolerance failure (a build error
of the region is a failing step). A build that fails has no optimized graph:
the units are then the original nodes themselves, and marking is the switch
again (a fusion cannot swallow a marked tensor), so the search finds the
smallest set of original nodes whose outputs must stay unmarked for the
build to fail. The engine's own message often names a node or a tensor:
those names are mapped back to original nodes and tried first.
"""

from __future__ import annotations

import re
from typing import Optional

from bisect_tui.core.bisect.trials import BuildBudgetExceeded
from bisect_tui.core.bisect.units import Unit, build_units
from bisect_tui.core.cancel import Progress

_QUOTED = re.compile(r"""['"]([^'"\n]{1,300})['"]""")


def named_in_error(message: Optional[str], index, units: Optional[list[Unit]] = None) -> dict:
    """Names the engine's message quotes that are nodes or tensors of the model
    (or fused nodes of its optimized graph), with the original nodes they stand
    for: a node itself, a tensor's producer and consumers, a fused node's cover."""
    names, nodes = [], []
    by_fused = {u.fused_node: u for u in units or []}
    for m in _QUOTED.finditer(message or ""):
        name = m.group(1)
        hit: list[str] = []
        if name in by_fused:
            hit = list(by_fused[name].original_nodes)
        elif name in index.by_name:
            hit = [name]
        elif name in index.producer or name in index.consumers:
            hit = ([index.producer[name]] if name in index.producer else []) + list(index.consumers.get(name, []))
        else:
            head = name.split("/", 1)[0]  # a fused node named after the original node it kept
            if head in index.by_name and head != name:
                hit = [head]
        if hit:
            names.append(name)
            nodes.extend(hit)
    nodes = sorted(dict.fromkeys(nodes), key=lambda n: index.order.get(n, 0))
    return {"names": list(dict.fromkeys(names)), "original_nodes": nodes}


def node_units(index) -> list[Unit]:
    """Each original node as a unit: its outputs (not graph outputs) are what
    marking holds; leaving them unmarked lets a pass fuse across them."""
    outs = set(index.graph_outputs)
    units = []
    for n in index.nodes:
        interior = [t for t in n.output if t and t not in outs]
        units.append(Unit(index=len(units), fused_node=n.name, op_type=n.op_type, original_nodes=[n.name],
                          optimizers=[], outputs=[t for t in n.output if t], interior=interior, domain=n.domain,
                          inputs=[i for i in n.input if i and i not in index.initializers]))
    return units


def failing_run_units(search, level: str) -> Optional[tuple[list[Unit], Optional[str]]]:
    """The units of an engine that builds and then fails while running: its map,
    read from a build without a run (the failing step kept none). None: it does not build."""
    cfg = search.config.with_level(level)
    try:
        fused, optimized = search.rebuild_map(cfg, search.engine_dir(cfg))
    except Exception:  # noqa: BLE001  (it does not build either: the region search runs instead)
        return None
    search.builds += 1
    return build_units(fused, search.index), optimized


def region_search(search, result: dict, level: str) -> dict:
    """The smallest set of original nodes whose outputs must stay unmarked for
    the engine to fail (the rest marked, so no pass can fuse across them)."""
    err = result["engine_error"]
    units = [u for u in node_units(search.index) if u.blockable]
    named = set(err.get("original_nodes") or [])
    seeds = [u for u in units if named & set(u.original_nodes)]
    cfg = search.config.with_level(level)
    search.config, saved = cfg, search.config
    found, stopped = None, None
    search.progress(Progress("bisect", f"the {level} engine fails without an optimized graph: searching the "
                                       f"{len(units)} original nodes by marking"))
    try:
        pool = units
        if seeds and len(seeds) < len(units) and not search.evaluate("nodes the error names", seeds).passed:
            pool = seeds  # the nodes the message names already fail: the search stays among them
        found = search.find_one(pool, [], [])
        if found and len(found) > 1 and search.evaluate("error region alone", found).passed:
            found = None  # not monotone: no region of marks reproduces it
    except BuildBudgetExceeded:
        stopped = "max_builds"
    finally:
        search.config = saved
    region = [n for u in (found or []) for n in u.original_nodes]
    result.update(verdict="no_culprit", culprits=[], units=[], level=level,
                  error_region={"original_nodes": region, "units": "original nodes",
                                "searched": len(units), "seeds": [u.fused_node for u in seeds]},
                  explanation=("the engine fails at this level without an optimized graph to map; the original "
                               "nodes whose outputs must stay unmarked for it to fail were searched by marking "
                               "the rest" + ("" if region else ": no such set (the failure needs the unmarked "
                                                             "engine)")))
    if stopped:
        result["stopped"] = stopped
    return result


MAX_ISOLATION_BUILDS = 24


def isolate_failing_node(triage, config, out_dir, kind: str = "build_error") -> Optional[dict]:
    """Where marking changes nothing (the engine fails with every tensor marked
    too), subgraphs are built alone instead: the shortest prefix of the graph
    (in topological order) whose build or run fails, then its last node alone,
    fed the baseline's own tensors. Returns {"node", "op_type", "alone", "message",
    "builds"}, or None when no prefix fails alone (the failure needs the whole
    model) or the graph cannot be cut (nested graphs reading outer tensors). Only a
    failure of the same `kind` counts (a cut graph that builds, then fails on how it
    was fed, says nothing about a build error)."""
    import numpy as np

    from bisect_tui.core import atomic
    from bisect_tui.core.baseline_store import load_tensor
    from bisect_tui.core.bisect.isolate import extract_subgraph, value_types
    from bisect_tui.core.errors import EngineBuildError, EnvironmentFault

    index, model = triage.info.index, triage.info.model
    nodes = [n for n in index.nodes if n.output]
    if not nodes:
        return None
    types = value_types(triage)
    out_dir.mkdir(parents=True, exist_ok=True)
    builds = 0

    def feed(name: str):
        if name in triage.inputs.arrays:
            return np.asarray(triage.inputs.arrays[name][0], order="C")
        return np.asarray(load_tensor(triage.session, triage.baseline.manifest, name)[0], order="C")

    def failure(names: list[str]) -> Optional[str]:
        """The engine's message when the subgraph of `names` fails to build or run."""
        nonlocal builds
        inside = set(names)
        outs = [t for n in names for t in index.by_name[n].output if t and t in types and
                (t in index.graph_outputs or any(c not in inside for c in index.consumers.get(t, [])))]
        if not outs:
            outs = [t for t in index.by_name[names[-1]].output if t in types]
        sub, ins = extract_subgraph(model, names, outs, types)
        path = out_dir / f"nodes_{len(names)}_{len(names) and index.order[names[0]]}.onnx"
        atomic.write_bytes(path, sub.SerializeToString())
        builds += 1
        try:
            built = triage.engine.build(path, config, (), None)
        except EnvironmentFault:
            raise
        except EngineBuildError as exc:
            return exc.engine_message if exc.kind == kind else None
        try:
            if kind == "run_error":
                built.run({i: feed(i) for i in ins})
        except EngineBuildError as exc:
            return exc.engine_message if exc.kind == kind else None
        finally:
            built.close()
        return None

    names = [n.name for n in nodes]
    try:
        lo, hi = 0, len(names) - 1
        last = failure(names)
        if last is None:
            return None  # cut into a graph of its own, the whole model builds: the failure needs the model
        while lo < hi and builds < MAX_ISOLATION_BUILDS:
            mid = (lo + hi) // 2
            msg = failure(names[: mid + 1])
            if msg is None:
                lo = mid + 1
            else:
                hi, last = mid, msg
        node = index.by_name[names[lo]]
        alone = failure([node.name]) if lo > 0 else last
    except (KeyError, ValueError, TypeError, onnx_errors()):
        return None  # a tensor without a dumped type, a nested graph reading outer tensors
    return {"node": node.name, "op_type": node.op_type, "alone": alone is not None,
            "message": alone if alone is not None else last, "builds": builds}


def onnx_errors() -> tuple:
    import onnx

    return (onnx.checker.ValidationError,) if hasattr(onnx.checker, "ValidationError") else ()
