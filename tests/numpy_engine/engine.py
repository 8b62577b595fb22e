"""The numpy engine's build and run (see the package docstring)."""

from __future__ import annotations

from pathlib import Path
from typing import Collection, Optional, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from bisect_tui.api import BuildContext, EngineBase, EngineBuildError, EngineConfig, FusedNode
from numpy_engine import CAPABILITIES, LABEL, OPTIONS

_OPS = {
    "MatMul": lambda a, b: a @ b,
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Relu": lambda a: np.maximum(a, 0),
    "Identity": lambda a: a,
}


def _kernel(ops: tuple[str, ...]):
    """The fused kernel of a MatMul+Add(+Relu) pattern: with a Relu it multiplies in float16."""
    def run(x, w, b):
        if ops[-1] == "Relu":
            y = (x.astype(np.float16) @ w.astype(np.float16)).astype(np.float32) + b
            return np.maximum(y, 0).astype(np.float32)
        return (x @ w + b).astype(np.float32)
    return run


def _patterns(graph: onnx.GraphProto, keep: set[str]) -> list[list[onnx.NodeProto]]:
    """MatMul -> Add (-> Relu) chains whose inner tensors are used once, are no
    graph output and are not in `keep` (the marked tensors)."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}

    def only_next(n: onnx.NodeProto, op: str) -> Optional[onnx.NodeProto]:
        t = n.output[0]
        nxt = consumers.get(t, [])
        if t in outputs or t in keep or len(nxt) != 1 or nxt[0].op_type != op:
            return None
        return nxt[0]

    out = []
    for n in graph.node:
        if n.op_type != "MatMul":
            continue
        add = only_next(n, "Add")
        if add is None:
            continue
        relu = only_next(add, "Relu")
        out.append([n, add] + ([relu] if relu is not None else []))
    return out


class NumpyBuilt:
    def __init__(self, model: onnx.ModelProto, config: EngineConfig, marked: list[str]):
        g = model.graph
        self.config = config
        self.unmarkable = [t for t in marked if t not in {o for n in g.node for o in n.output}]
        marked = [t for t in marked if t not in self.unmarkable]
        self.output_names = [o.name for o in g.output] + [t for t in marked if t not in {o.name for o in g.output}]
        self.optimized_model_path: Optional[Path] = None
        self._weights = {i.name: numpy_helper.to_array(i) for i in g.initializer}
        fused = {id(n): p for p in _patterns(g, set(marked)) for n in p}
        self._program: list[tuple] = []  # (kind, node or pattern)
        self.fused_nodes: list[FusedNode] = []
        for n in g.node:
            if n.op_type not in _OPS:
                raise EngineBuildError(f"the numpy engine has no kernel for {n.op_type}", n.op_type)
            p = fused.get(id(n))
            if p is None:
                self._program.append(("op", n))
                self.fused_nodes.append(FusedNode(n.name, n.op_type, inputs=list(n.input),
                                                  outputs=list(n.output), original_nodes=[n.name]))
            elif n is p[-1]:
                ops = tuple(x.op_type for x in p)
                self._program.append(("fused", p))
                bias = [i for i in p[1].input if i != p[0].output[0]][0]
                self.fused_nodes.append(FusedNode("Fused" + "".join(ops), "Fused" + "".join(ops),
                                                  domain="numpy", inputs=list(p[0].input) + [bias],
                                                  outputs=[p[-1].output[0]], original_nodes=[x.name for x in p]))

    def run(self, feeds: dict, names: Optional[Sequence[str]] = None) -> dict:
        env = {**self._weights, **{k: np.asarray(v) for k, v in feeds.items()}}
        for kind, item in self._program:
            if kind == "op":
                env[item.output[0]] = _OPS[item.op_type](*(env[i] for i in item.input)).astype(np.float32)
            else:
                mm, add = item[0], item[1]
                bias = [i for i in add.input if i != mm.output[0]][0]
                env[item[-1].output[0]] = _kernel(tuple(x.op_type for x in item))(
                    env[mm.input[0]], env[mm.input[1]], env[bias])
        wanted = self.output_names if names is None else [n for n in self.output_names if n in set(names)]
        return {n: env[n] for n in wanted}

    def observe(self, feeds, tensors) -> dict:
        return {}

    def fusions_across(self, marks: Collection[str]) -> list[FusedNode]:
        return []

    def precision_used(self) -> str:
        return "fp32"

    def close(self) -> None:
        self._program = []


class NumpyEngine(EngineBase):
    name = "numpy"
    label = LABEL
    library = "numpy"
    options = OPTIONS
    capabilities = CAPABILITIES

    def build(self, model_path: Path, config: EngineConfig, marked: Collection[str] = (),
              workdir: Optional[Path] = None, *, context: Optional[BuildContext] = None) -> NumpyBuilt:
        self.validate(config)
        return NumpyBuilt(onnx.load(str(model_path)), config, list(dict.fromkeys(marked)))

    def versions(self) -> dict[str, str]:
        return {"numpy": np.__version__}
