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
