"""Units of the search: the fused nodes of the engine, and how to block each one.

A unit is one fused node of the optimized graph with the original nodes it
replaced. Its *interior* tensors are the outputs of those original nodes that
the fused node does not produce; marking any of them blocks the fusion. A
unit with no interior tensor (a single op rewritten in place) cannot be
blocked by marking; the search reports such units instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from bisect_tui.core.graph import GraphIndex
from bisect_tui.api import FusedNode


@dataclass
class Unit:
    index: int  # position in topological order of the search
    fused_node: str
    op_type: str
    original_nodes: list[str]
    optimizers: list[str]
    outputs: list[str]  # original tensors the fused node produces
    interior: list[str] = field(default_factory=list)  # tensors whose marking blocks it
    domain: str = ""
    inputs: list[str] = field(default_factory=list)  # original tensors flowing into the pattern

    @property
    def blockable(self) -> bool:
        return bool(self.interior)

    def label(self) -> str:
        return f"{self.fused_node} ({self.op_type}, {len(self.original_nodes)} nodes)"

    def to_dict(self) -> dict:
        # by hand, not dataclasses.asdict (a deep copy through every list): thousands per result
        return {"index": self.index, "fused_node": self.fused_node, "op_type": self.op_type,
                "original_nodes": list(self.original_nodes), "optimizers": list(self.optimizers),
                "outputs": list(self.outputs), "interior": list(self.interior), "domain": self.domain,
                "inputs": list(self.inputs)}

    @classmethod
    def from_dict(cls, d: dict) -> "Unit":
        return cls(**d)


def build_units(fused: Iterable[FusedNode], index: GraphIndex) -> list[Unit]:
    """Fused nodes -> units in topological order of their last original node."""
    units: list[Unit] = []
    original_tensors = index.producer
    graph_outputs = set(index.graph_outputs)
    by_name = index.by_name
    consumers = index.consumers
    initializers = index.initializers
    io_by_name = index.io_by_name()  # plain lists: no protobuf field read per covered node
    no_consumers: list[str] = []
    for fn in fused:
        if not fn.is_fused or not fn.original_nodes:
            continue
        covered = [n for n in fn.original_nodes if n in by_name]
        inside = set(covered)
        io = [io_by_name[n] for n in covered]
        produced = [t for _, n_outs in io for t in n_outs if t]
        # The pattern's outputs are what leaves it (consumed outside, or a graph
        # output), which holds even when the engine renamed the fused node's
        # output tensors (fp16 casts, layout rewrites).
        outs = [t for t in produced
                if t in graph_outputs or not inside.issuperset(consumers.get(t, no_consumers))]
        if not outs:
            outs = [t for t in fn.outputs if t in original_tensors]
        out_set = set(outs)
        interior = [t for t in produced if t not in out_set]
        produced_set = set(produced)
        ins: list[str] = []
        seen: set[str] = set()
        for n_ins, _ in io:
            for i in n_ins:
                if i and i not in produced_set and i not in initializers and i not in seen:
                    seen.add(i)
                    ins.append(i)
        units.append(
            Unit(
                index=0,
                fused_node=fn.name,
                op_type=fn.op_type,
                original_nodes=covered,
                optimizers=list(fn.passes),
                outputs=outs,
                interior=interior,
                domain=fn.domain,
                inputs=ins,
            )
        )
    order = index.order
    units.sort(key=lambda u: max([order.get(n, 0) for n in u.original_nodes]))
    for i, u in enumerate(units):
        u.index = i
    return units


def marks_for(enabled: Iterable[Unit], all_tensors: list[str], always: Iterable[str] = ()) -> list[str]:
    """Tensors to mark so that only `enabled` units may fuse.

    Every intermediate tensor is marked except the interior tensors of the
    enabled units. `always` adds tensors that stay marked regardless (held
    culprits)."""
    free: set[str] = set()
    for u in enabled:
        free.update(u.interior)
    free.difference_update(always)
    return [t for t in all_tensors if t not in free]


def region_text(units: list[Unit]) -> str:
    if not units:
        return "no fusion"
    if len(units) == 1:
        return f"#{units[0].index} {units[0].fused_node}"
    idx = [u.index for u in units]
    # the error region search's units are the original nodes themselves (engine_errors.node_units)
    noun = "original nodes" if all(u.original_nodes == [u.fused_node] for u in units) else "fused nodes"
    if idx == list(range(idx[0], idx[-1] + 1)):
        return f"#{idx[0]}..#{idx[-1]} ({len(units)} {noun})"
    return f"{len(units)} {noun} (#" + ", #".join(map(str, idx[:6])) + (", ..." if len(idx) > 6 else "") + ")"
