"""ONNX Runtime's FP16 model, with a keep-set that really stays in FP32.

The FP16 engine is what ORT users run: onnxruntime's own converter
(`convert_float_to_float16(keep_io_types=True)`), so the nodes it computes in
FP16 are the ones users get. Its `node_block_list` alone cannot keep anything
on real exports, and a keep-set search built on it cannot prove anything (its
"keep every node" control did not reproduce FP32, issue 21):

* a blocked node's output is always cast to FP16 and back, also when every
  consumer is blocked; the graph inputs too (keep_io_types casts them to FP16
  first), so a path of kept nodes is rounded at every edge;
* an initializer read by an FP16 node and a kept node is stored once, in FP16,
  and the kept node reads it through a Cast back: rounded weights;
* weights held in `Constant` nodes (Paddle2ONNX: half the nodes) are converted
  in place, whatever their consumers; unnamed nodes cannot be named at all.

So: every node is named first (the rule of core.graph.name_nodes, which gave
the names users see), top-level `Constant` nodes become initializers, the
converter runs, and then its casts are repaired: a Cast back to FP32 of a value
that was FP32 before the converter's own Cast to FP16 becomes an Identity of
the FP32 value, and a kept node reading a weight rounded to FP16 reads the
original FP32 weight. Casts remain only where an FP16 node meets an FP32 one.
Nothing else of the converter's output changes, so with nothing kept the model
is the converter's (its own bugs included: they are what users hit).

This file imports only numpy, onnx and onnxruntime (outside `fp16_model_path`):
the keep-set repro bundle ships a copy of it as `fp16_convert.py`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Collection, Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VERSION = "2"  # in the cache file name: a model converted by an older rule is not reused

_IO_IN = "graph_input_cast"
_IO_OUT = "graph_output_cast"


def name_nodes(model: onnx.ModelProto) -> int:
    """Unique names for unnamed or duplicate-named top-level nodes, `{op}_{index}`
    (the same rule as core.graph.name_nodes, so a name from a report is found here)."""
    seen: set[str] = set()
    renamed = 0
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            base = name = f"{node.op_type}_{i}"
            k = 1
            while name in seen:
                name = f"{base}_{k}"
                k += 1
            node.name = name
            renamed += 1
        seen.add(node.name)
    return renamed


def _constant_tensor(node: onnx.NodeProto):
    """The tensor a Constant node makes, or None when it is not a plain value."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
        return None
    a = node.attribute[0]
    if a.name == "value":
        t = TensorProto()
        t.CopyFrom(a.t)
    elif a.name == "value_float":
        t = numpy_helper.from_array(np.array(a.f, dtype=np.float32))
    elif a.name == "value_floats":
        t = numpy_helper.from_array(np.array(list(a.floats), dtype=np.float32))
    elif a.name == "value_int":
        t = numpy_helper.from_array(np.array(a.i, dtype=np.int64))
    elif a.name == "value_ints":
        t = numpy_helper.from_array(np.array(list(a.ints), dtype=np.int64))
    else:
        return None
    t.name = node.output[0]
    return t


def lift_constants(model: onnx.ModelProto) -> list[str]:
    """Top-level Constant nodes become initializers (same tensor name), so the
    converter treats their weights like any other: in FP32 for kept consumers.
    Returns the names of the nodes removed. IR < 4 needs every initializer
    listed as a graph input: such models are left alone."""
    if model.ir_version and model.ir_version < 4:
        return []
    g = model.graph
    taken = {t.name for t in g.initializer} | {i.name for i in g.input} | {o.name for o in g.output}
    keep_nodes, lifted = [], []
    for node in g.node:
        t = _constant_tensor(node)
        if t is None or t.name in taken:
            keep_nodes.append(node)
            continue
        g.initializer.append(t)
        lifted.append(node.name)
    if lifted:
        del g.node[:]
        g.node.extend(keep_nodes)
    return lifted


def _cast_to(node: onnx.NodeProto):
    return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None


def _subgraphs(node: onnx.NodeProto) -> Iterable[onnx.GraphProto]:
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _rename_outer(graph: onnx.GraphProto, rename: dict[str, str]) -> None:
    """Outer-scope names read inside a (nested) subgraph, renamed."""
    inner = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    inner |= {o for n in graph.node for o in n.output}
    live = {k: v for k, v in rename.items() if k not in inner}
    if not live:
        return
    for n in graph.node:
        for i, name in enumerate(n.input):
            if name in live:
                n.input[i] = live[name]
        for sub in _subgraphs(n):
            _rename_outer(sub, live)
    for o in graph.output:
        if o.name in live:  # a subgraph output passing an outer value through
            o.name = live[o.name]


def repair_casts(converted: onnx.ModelProto, original_nodes: set[str],
                 fp32_weights: dict[str, TensorProto], blocked: set[str] = frozenset(),
                 float_values: set[str] = frozenset()) -> dict:
    """Undo the converter's FP16 round trips (see the module docstring).

    `original_nodes`: node names before conversion (the converter's own Casts
    are the others); `fp32_weights`: the float initializers before conversion;
    `blocked`: the nodes left in FP32 (their subgraphs were not converted);
    `float_values`: the top-level values that were FP32 before conversion."""
    g = converted.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {t.name: t for t in g.initializer}
    made = lambda n: n.name not in original_nodes  # noqa: E731 - the converter's casts only
    fp32_of: dict[str, str] = {}  # an FP16 value -> the FP32 value it was rounded from

    def fp32_source(name: str):
        p = producer.get(name)
        if p is not None and made(p) and _cast_to(p) == TensorProto.FLOAT16 and (
                p.name.startswith(_IO_IN) or p.name.endswith("_cast_to_fp16_node")):
            return p.input[0]
        t = inits.get(name)
        if t is not None and t.data_type == TensorProto.FLOAT16 and name in fp32_weights:
            if name not in fp32_of:
                copy = TensorProto()
                copy.CopyFrom(fp32_weights[name])
                copy.name = _unique(name + "_fp32", producer, inits)
                g.initializer.append(copy)
                inits[copy.name] = copy
                fp32_of[name] = copy.name
            return fp32_of[name]
        return None

    identities = 0
    for n in g.node:
        if made(n) and _cast_to(n) == TensorProto.FLOAT and (
                n.name.endswith("_cast_to_fp32_node") or n.name.startswith(_IO_OUT)):
            src = fp32_source(n.input[0])
            if src is not None:
                del n.attribute[:]
                n.op_type, n.domain = "Identity", ""
                n.input[0] = src
                identities += 1
    # kept nodes with subgraphs read outer values by name: give them the FP32 ones, and
    # a Cast where the value comes from an FP16 node (the converter left those FP16: a type error)
    casts: dict[str, onnx.NodeProto] = {}  # an FP16 value -> its Cast to FP32 for subgraphs
    for n in list(g.node):
        if n.name in blocked:
            for sub in _subgraphs(n):
                rename = {}
                for name in _reads_in(sub):
                    src = fp32_source(name) if name in producer or name in inits else None
                    if src is None and name in float_values and name in producer \
                            and producer[name].name in original_nodes and producer[name].name not in blocked:
                        if name not in casts:
                            out = _unique(f"{name}_cast_to_fp32_outer", producer, inits)
                            casts[name] = helper.make_node("Cast", [name], [out], to=TensorProto.FLOAT,
                                                           name=out + "_node")
                            producer[out] = casts[name]
                        src = casts[name].output[0]
                    if src is not None:
                        rename[name] = src
                _rename_outer(sub, rename)
    g.node.extend(casts.values())
    removed = _drop_dead(converted, original_nodes)
    return {"round_trips_removed": identities, "dead_nodes_removed": removed}


def _unique(base: str, *taken) -> str:
    name, k = base, 1
    while any(name in t for t in taken):
        name, k = f"{base}_{k}", k + 1
    return name


def _drop_dead(model: onnx.ModelProto, original_nodes: set[str]) -> int:
    """The converter's Casts (and the Identities made of them) and the
    initializers nothing reads any more; the model's own nodes all stay."""
    g = model.graph
    outputs = {o.name for o in g.output}
    removed = 0
    while True:
        read = {i for n in g.node for i in n.input} | outputs
        for n in g.node:
            for sub in _subgraphs(n):
                read |= _reads_in(sub)
        dead = [n for n in g.node if n.name not in original_nodes and n.op_type in ("Cast", "Identity")
                and not any(o in read for o in n.output)]
        if not dead:
            break
        dead_ids = {id(n) for n in dead}
        live = [n for n in g.node if id(n) not in dead_ids]
        del g.node[:]
        g.node.extend(live)
        removed += len(dead)
    read = {i for n in g.node for i in n.input} | outputs
    for n in g.node:
        for sub in _subgraphs(n):
            read |= _reads_in(sub)
    read |= {i.name for i in g.input}  # an initializer listed as an input (IR < 4) stays
    unused = [t for t in g.initializer if t.name not in read]
    if unused:
        live_t = [t for t in g.initializer if t.name in read]
        del g.initializer[:]
        g.initializer.extend(live_t)
    names = {o for n in g.node for o in n.output} | {t.name for t in g.initializer} | {i.name for i in g.input}
    live_vi = [v for v in g.value_info if v.name in names]
    del g.value_info[:]
    g.value_info.extend(live_vi)
    return removed


def _reads_in(graph: onnx.GraphProto) -> set[str]:
    out = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for n in graph.node:
        for sub in _subgraphs(n):
            out |= _reads_in(sub)
    return out


def _float_values(model: onnx.ModelProto) -> set[str]:
    """Top-level values of type FP32 (by onnx's shape inference; empty where it fails)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a model over 2 GB, a custom op: no Casts for subgraph reads then
        return set()
    g = inferred.graph
    vis = list(g.value_info) + list(g.input) + list(g.output)
    return {v.name for v in vis if v.type.tensor_type.elem_type == TensorProto.FLOAT} | \
        {t.name for t in g.initializer if t.data_type == TensorProto.FLOAT}


def convert(model: onnx.ModelProto, keep_fp32: Collection[str] = ()) -> tuple[onnx.ModelProto, dict]:
    """The FP16 model with the nodes named in `keep_fp32` computing in FP32 on
    FP32 inputs; graph inputs and outputs stay FP32. Returns (model, what was done).
    `model` is not modified."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    m = onnx.ModelProto()
    m.CopyFrom(model)
    renamed = name_nodes(m)
    lifted = lift_constants(m)
    keep = set(keep_fp32)
    original_nodes = {n.name for n in m.graph.node}
    fp32_weights = {}
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            c = TensorProto()
            c.CopyFrom(t)
            fp32_weights[t.name] = c
    blocked = {n.name for n in m.graph.node if n.name in keep or n.op_type in DEFAULT_OP_BLOCK_LIST}
    converted = convert_float_to_float16(m, keep_io_types=True, node_block_list=sorted(keep) or None)
    done = repair_casts(converted, original_nodes, fp32_weights, blocked, _float_values(m))
    casts16 = sum(1 for n in converted.graph.node if _cast_to(n) == TensorProto.FLOAT16)
    done.update(nodes_named=renamed, constants_lifted=len(lifted), kept=len(keep & original_nodes),
                kept_unknown=sorted(keep - original_nodes - set(lifted)), casts_to_fp16=casts16)
    return converted, done


def convert_path(model_path: Path, keep_fp32: Collection[str] = ()) -> tuple[onnx.ModelProto, dict]:
    return convert(onnx.load(str(model_path)), keep_fp32)


def fp16_model_path(model_path: Path, workdir: Path, keep_fp32: Collection[str] = ()) -> Path:
    """The FP16 conversion of `model_path`, cached in workdir by source hash,
    converter version and keep-set.

    Conversion is deterministic but not free on big models and a bisection
    builds dozens of engines from the same source, so convert once."""
    from bisect_tui.api import EngineBuildError
    from bisect_tui.core.external_data import load_with_weights
    from bisect_tui.core.onnx_files import (EXTERNAL_DATA_THRESHOLD, file_hash, first_line, save_model,
                                            uses_external_data_file)

    keep = sorted(set(keep_fp32))
    tag = "" if not keep else "_keep" + hashlib.sha1("\n".join(keep).encode()).hexdigest()[:10]
    cached = Path(workdir) / f"fp16_v{VERSION}_{file_hash(model_path)}{tag}.onnx"
    if cached.exists():
        return cached
    try:
        # external data: read by our reader (onnx.load refuses the session's linked data files)
        converted, _ = convert(load_with_weights(Path(model_path)), keep)
    except Exception as e:  # the converter asserts on models it cannot handle
        raise EngineBuildError(f"could not convert the model to fp16: {first_line(e)}", first_line(e)) from None
    # weights outside when the source keeps them outside (never one big proto of a big model),
    # else above onnx_files' threshold (a proto stops at 2 GiB)
    save_model(converted, cached, 0 if uses_external_data_file(Path(model_path)) else EXTERNAL_DATA_THRESHOLD)
    return cached


__all__ = ["VERSION", "convert", "convert_path", "fp16_model_path", "lift_constants", "name_nodes", "repair_casts"]
