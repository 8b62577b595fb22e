"""A small programmed engine for tests: its fused map and each fused node's
error are given, and it can hold the search at a chosen engine build.

The numbers are real: every build runs the real model unfused in ONNX
Runtime (the same values as the baseline) and adds the programmed error to
the graph outputs while a faulty fused node is still fused, i.e. while none of
its interior tensors is marked. That is exactly the contract the search relies
on (marking a tensor inside a fusion blocks it), so the search, attribution,
workaround and resume run unmodified against it."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Collection, Optional, Sequence

import numpy as np
import onnx

from bisect_tui.core.graph import GraphIndex, mark_outputs
from bisect_tui.engines.ort.unfused import make_session
from bisect_tui.api import Capabilities, EngineConfig, FusedNode, ReproSpec


class FakeBuilt:
    def __init__(self, engine: "FakeEngine", model_path: Path, config: EngineConfig, marked: list[str],
                 workdir: Optional[Path]):
        self.config = config
        self.engine = engine
        model = onnx.load(str(model_path))
        self._outputs = [o.name for o in model.graph.output]
        self.output_names = self._outputs + [t for t in marked if t not in self._outputs]
        self.unmarkable: list[str] = []
        self._session = make_session(mark_outputs(model, marked) if marked else model)
        self._marked = set(marked)
        self.fused_nodes = [FusedNode.from_dict(f.to_dict()) for f in engine.fused]
        index = GraphIndex.build(model)
        # fused nodes of the programmed map present in this model (an extracted subgraph holds some)
        present = [f for f in engine.fused if all(n in index.by_name for n in f.original_nodes)]
        self._interior = {f.name: {t for n in f.original_nodes for t in index.by_name[n].output
                                   if t and t not in f.outputs} for f in present}
        self.optimized_model_path = None
        if workdir is not None:
            self.optimized_model_path = Path(workdir) / "fake_engine.json"
            self.optimized_model_path.write_text(json.dumps([f.to_dict() for f in engine.fused]))

    def active_errors(self) -> float:
        """Sum of the programmed errors of the faulty nodes this build leaves fused."""
        return sum(e for name, e in self.engine.errors.items()
                   if name in self._interior and not (self._interior[name] & self._marked))

    def run(self, feeds: dict[str, np.ndarray], names=None) -> dict[str, np.ndarray]:
        outs = [o.name for o in self._session.get_outputs()]
        values = dict(zip(outs, self._session.run(outs, feeds)))
        shift = self.active_errors()
        for n in self._outputs:
            values[n] = (values[n] + np.float32(shift)).astype(values[n].dtype)
        keep = self.output_names if names is None else [n for n in self.output_names if n in set(names)]
        return {n: values[n] for n in keep}

    def observe(self, feeds, tensors: Sequence[str]) -> dict[str, np.ndarray]:
        return {}

    def fusions_across(self, marks: Collection[str]) -> list[FusedNode]:
        return []

    def precision_used(self) -> str:
        return self.config.precision

    def close(self) -> None:
        self._session = None


class FakeEngine:
    name = "fake"
    label = "fake engine"
    library = "numpy"
    options = ()
    capabilities = Capabilities(marking=True, marking_blocks=True, pass_switches=False,
                                keep_high_precision=False, levels=("all",), precisions=("fp32",),
                                observation="none")

    def __init__(self, fused: list[FusedNode], errors: dict[str, float], hold_at: Optional[int] = None):
        self.fused = fused
        self.errors = errors
        self.builds = 0
        self.hold_at = hold_at
        self.reached = threading.Event()
        self.release = threading.Event()

    def build(self, model_path: Path, config: EngineConfig, marked: Collection[str] = (),
              workdir: Optional[Path] = None) -> FakeBuilt:
        self.builds += 1
        if self.hold_at is not None and self.builds == self.hold_at:
            self.reached.set()  # the test now knows the search is at this build
            self.release.wait(timeout=60)
        return FakeBuilt(self, Path(model_path), config, list(marked), workdir)

    def validate(self, config: EngineConfig) -> None:
        pass

    def describe(self, config: EngineConfig) -> list[tuple[str, str]]:
        return [("engine", "fake")]

    def observer(self, model_path, config, optimized_path):
        return None

    def workaround_text(self, workaround) -> str:
        if workaround.get("kind") == "mark_outputs":
            return "mark " + ", ".join(workaround.get("marked_tensors") or [])
        return "no switch"

    def write_repro(self, dest: Path, spec: ReproSpec) -> list[Path]:
        path = Path(dest) / "repro.json"
        path.write_text(json.dumps({"outputs": spec.outputs}))
        return [path]

    def known_passes(self) -> set[str]:
        return set()

    def unknown_passes(self, names) -> list[str]:
        return list(names)

    def versions(self) -> dict[str, str]:
        return {"fake": "1"}


def save_two_linear(path: Path) -> list[FusedNode]:
    """The fake engine's usual model, two Linear layers with a Relu between,
    saved to `path`; returns the fused map to program (one Gemm per layer)."""
    from testlib import init, make_model, vi

    rng = np.random.default_rng(3)
    nodes = [onnx.helper.make_node("MatMul", ["x", "w1"], ["m1"], name="l1/matmul"),
             onnx.helper.make_node("Add", ["m1", "b1"], ["a1"], name="l1/bias"),
             onnx.helper.make_node("Relu", ["a1"], ["r1"], name="l1/relu"),
             onnx.helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="l2/matmul"),
             onnx.helper.make_node("Add", ["m2", "b2"], ["y"], name="l2/bias")]
    inits = [init("w1", rng.standard_normal((8, 8)).astype(np.float32)), init("b1", np.zeros(8, np.float32)),
             init("w2", rng.standard_normal((8, 8)).astype(np.float32)), init("b2", np.zeros(8, np.float32))]
    onnx.save(make_model(nodes, [vi("x", [2, 8])], [vi("y", [2, 8])], inits), str(path))
    return [FusedNode("Gemm_1", "Gemm", inputs=["x"], outputs=["a1"], original_nodes=["l1/matmul", "l1/bias"]),
            FusedNode("Gemm_2", "Gemm", inputs=["r1"], outputs=["y"], original_nodes=["l2/matmul", "l2/bias"])]
