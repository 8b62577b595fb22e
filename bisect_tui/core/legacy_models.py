"""Models written for old ONNX: IR version 3 graphs and opsets below 7.

Two things break on them that the user's own runtime session does not
show. An IR-3 graph lists every initializer as a graph input; when an
engine folds an initializer away (the weights a ConstantOfShape makes) it
saves the optimized graph with that name still listed as an input but with no
value behind it, so reloading the saved graph demands a feed nobody has. And
an opset-6 model using an operator a runtime implements only from opset 7 on
cannot be loaded at all (the reference says so: `check_loadable`); onnx's version converter fixes that, but
the converted file is a different model, which the user has to adopt (their
runtime cannot run the old one either), so we say how instead of testing a
file they never run.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Collection

import onnx

# the opset the conversion aims at: the oldest whose operators the runtimes implement throughout
RUNTIME_MIN_OPSET = 7

def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor a node of `graph` or of its subgraphs reads."""
    names: set[str] = set()
    for node in graph.node:
        names.update(node.input)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                names |= _read_names(sub)
    return names


def drop_unfed_inputs(model: onnx.ModelProto, fed: Collection[str]) -> list[str]:
    """Remove (in place) graph inputs that have no value behind them: no feed, no
    initializer, read by no node and no graph output. Returns their names.

    Such inputs are what a saved IR-3 optimized graph keeps of the initializers
    the engine folded away; a session made from it would refuse every feed
    without them, although nothing would read them."""
    graph = model.graph
    keep = set(fed) | {o.name for o in graph.output}
    if all(vi.name in keep for vi in graph.input):
        return []  # every input fed (the usual case): no walk over every node's inputs per group
    keep |= {t.name for t in graph.initializer}
    keep |= _read_names(graph)
    dropped = [vi.name for vi in graph.input if vi.name not in keep]
    if dropped:
        kept = [vi for vi in graph.input if vi.name in keep]
        del graph.input[:]
        graph.input.extend(kept)
    return dropped


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def upgraded_name(path: Path, opset: int = RUNTIME_MIN_OPSET) -> str:
    return f"{Path(path).stem}-opset{opset}.onnx"


def upgrade_command(path: Path, opset: int = RUNTIME_MIN_OPSET) -> str:
    """The shell command that writes the converted model into the current directory.

    Paths are data: JSON strings (valid Python literals, no single quotes to
    escape) inside one shell-quoted argument."""
    src, dest = json.dumps(str(path)), json.dumps(upgraded_name(path, opset))
    code = ("import onnx; from onnx import version_converter as v; "
            f"onnx.save(v.convert_version(onnx.load({src}), {opset}), {dest})")
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"
