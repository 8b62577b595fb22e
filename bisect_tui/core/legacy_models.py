"""Models written for old ONNX: IR version 3 graphs and opsets below 7.

Two things break on them that the user's own ONNX Runtime session does not
show. An IR-3 graph lists every initializer as a graph input; when ONNX
Runtime folds an initializer away (the weights a ConstantOfShape makes) it
saves the optimized graph with that name still listed as an input but with no
value behind it, so reloading the saved graph demands a feed nobody has. And
an opset-6 model using an operator that ONNX Runtime implements only from
opset 7 on cannot be loaded at all; onnx's version converter fixes that, but
the converted file is a different model, which the user has to adopt (their
runtime cannot run the old one either), so we say how instead of testing a
file they never run.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Collection, Optional

import onnx

# the opset the conversion aims at: the oldest whose operators ONNX Runtime implements throughout
RUNTIME_MIN_OPSET = 7

_NO_KERNEL = re.compile(r"Could not find an implementation for (\S+?)\((\d+)\)")


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
    keep = set(fed) | {t.name for t in graph.initializer} | {o.name for o in graph.output}
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


def old_opset_refusal(model: onnx.ModelProto, error: str, path: Path) -> Optional[str]:
    """The one line for a model the runtime cannot load because its opset is too old,
    or None when the load failed for another reason."""
    opset = default_opset(model)
    m = _NO_KERNEL.search(error)
    if m is None or not 0 < opset < RUNTIME_MIN_OPSET:
        return None
    return (f"{Path(path).name} imports opset {opset}: ONNX Runtime has no kernel for its "
            f"{m.group(1)}-{m.group(2)}: convert it to opset {RUNTIME_MIN_OPSET} with `{upgrade_command(path)}`, then run bisect-tui on "
            f"{shlex.quote(upgraded_name(path))}")


def refuse_unloadable_old_opset(model: onnx.ModelProto, path: Path) -> None:
    """Before any work: an opset-1..6 model the runtime cannot load stops with the
    conversion command (opset-6 models whose operators all have kernels run as
    they are: most do)."""
    if not 0 < default_opset(model) < RUNTIME_MIN_OPSET:
        return
    from bisect_tui.core.errors import UserError
    from bisect_tui.engines.ort.unfused import make_session

    try:
        make_session(model)
    except UserError as exc:
        refusal = old_opset_refusal(model, str(exc), path)
        if refusal is None:
            raise
        raise UserError(refusal) from None
