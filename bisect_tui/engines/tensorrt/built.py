"""A built TensorRT engine: its runner, its layer map, what its build learnt.

Runs only with TensorRT on a GPU, except the error paths: a runner that
cannot activate (no execution context, out of device memory) is an
`EngineRunError` with TensorRT's reason, like a failed inference."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from bisect_tui.core.errors import EngineRunError
from bisect_tui.api import EngineConfig, FusedNode
from bisect_tui.engines.tensorrt.buildlog import captured_errors, first_line
from bisect_tui.engines.tensorrt.inspector import parse_inspector
from bisect_tui.engines.tensorrt.layermap import fused_nodes_from_inspector, fusions_across
from bisect_tui.engines.tensorrt.precision import PrecisionPlan


def activate_runner(runner) -> None:
    """`TrtRunner.activate()`, its failure as one EngineRunError line."""
    with captured_errors() as logged:
        try:
            runner.activate()
        except Exception as e:
            reason = logged[0] if logged else first_line(e)
            raise EngineRunError(f"TensorRT could not prepare the engine to run: {reason}", reason) from None


class TrtBuilt:
    """A built TensorRT engine with its runner and its layer map.

    With dynamic inputs and no profile from the user, the engine is built on
    the first `run`, for exactly the shapes of those feeds (min = opt = max)."""

    def __init__(self, config: EngineConfig, source_path: Path, output_names: list[str],
                 unmarkable: list[str], make, tmpdir=None):
        self.config = config
        self.source_path = source_path
        self.output_names = output_names
        # TensorRT has no ONNX view of its plan: this becomes the inspector JSON file once built
        self.optimized_model_path: Optional[Path] = None
        self.unmarkable = unmarkable
        self.marking_error = ""
        self.inspector_json: Optional[str] = None
        self.precision_plan: Optional[PrecisionPlan] = None
        self.cache_hit = False
        self._make = make  # feeds shapes (or None) -> (engine, info dict)
        self._engine = None
        self._runner = None
        self._fused: Optional[list[FusedNode]] = None
        self._index = None
        self._dynamic_without_shapes = False  # set by the engine: build waits for the first feeds
        self._map_dir: Optional[Path] = None  # where the inspector JSON is written (set by the engine)
        self._tmpdir = tmpdir
        if tmpdir is not None:
            self._finalizer = weakref.finalize(self, tmpdir.cleanup)

    def ensure(self, shapes: Optional[dict] = None) -> None:
        if self._runner is not None:
            return
        from polygraphy.backend.trt import TrtRunner

        engine, info = self._make(shapes)
        self._engine = engine
        self.inspector_json = info["inspector"]
        if self.inspector_json and self._map_dir is not None:
            # the file that shows the optimized program: TensorRT's own layer list
            from bisect_tui.core import atomic

            path = Path(self._map_dir) / "trt_engine_layers.json"
            atomic.write_text(path, self.inspector_json)
            self.optimized_model_path = path
        self.marking_error = info["marking_error"]
        self.precision_plan = info["plan"]
        self.cache_hit = info["cache_hit"]
        # marking broke the build (rebuilt unmarked), or the network lacks the tensor
        lost = list(info["dropped_marks"]) + list(info.get("missing_marks") or [])
        if lost:
            self.unmarkable = list(dict.fromkeys(self.unmarkable + lost))
            self.output_names = [n for n in self.output_names if n not in lost]
        runner = TrtRunner(engine)
        activate_runner(runner)
        self._runner = runner

    def _graph(self):
        if self._index is None:
            import onnx

            from bisect_tui.core.graph import GraphIndex

            self._index = GraphIndex.build(onnx.load(str(self.source_path), load_external_data=False))
        return self._index

    @property
    def fused_nodes(self) -> list[FusedNode]:
        if self._fused is None:
            self.ensure()
            layers = parse_inspector(self.inspector_json) if self.inspector_json else []
            self._fused = fused_nodes_from_inspector(layers, self._graph())
        return self._fused

    def run(self, feeds: dict[str, np.ndarray], names: Optional[Sequence[str]] = None) -> dict[str, np.ndarray]:
        self.ensure({k: list(np.shape(v)) for k, v in feeds.items()})
        try:
            out = self._runner.infer(feed_dict=dict(feeds))
        except Exception as e:  # PolygraphyException, RuntimeError from CUDA
            raise EngineRunError(f"TensorRT failed running the engine: {first_line(e)}", first_line(e)) from None
        want = set(self.output_names if names is None else names) & set(self.output_names)
        return {k: np.array(v) for k, v in out.items() if k in want}

    def observe(self, feeds: dict[str, np.ndarray], tensors) -> dict[str, np.ndarray]:
        """Debug tensors captured by the runner's listener (engines built with
        unfused tensors marked as debug tensors), under their ONNX names."""
        self.ensure({k: list(np.shape(v)) for k, v in feeds.items()})
        try:
            out = self._runner.infer(feed_dict=dict(feeds))
        except Exception as e:
            raise EngineRunError(f"TensorRT failed running the engine: {first_line(e)}", first_line(e)) from None
        want = set(tensors)
        return {k: np.array(v) for k, v in out.items() if k in want}

    def fusions_across(self, marks) -> list[FusedNode]:
        return fusions_across(self.fused_nodes, marks, self._graph())

    def precision_used(self) -> str:
        """The lowest float precision a compute layer of the built engine writes."""
        self.ensure()
        layers = parse_inspector(self.inspector_json) if self.inspector_json else []
        seen = {la.precision for la in layers if not la.is_copy}
        for p in ("int8", "fp8", "fp16", "bf16", "tf32", "fp32"):
            if p in seen:
                return p
        return self.config.precision

    def close(self) -> None:
        if self._runner is not None:
            try:
                self._runner.deactivate()
            finally:
                self._runner = None
                self._engine = None
        if self._tmpdir is not None:
            self._finalizer()
            self._tmpdir = None


class TrtObserver:
    """The probe's view: an unmarked engine built with unfused tensors as
    debug tensors, so observing changes nothing about what TensorRT fused."""

    def __init__(self, built: TrtBuilt):
        self._built = built

    @property
    def tensors(self) -> list[str]:
        index = self._built._graph()
        return [t for f in self._built.fused_nodes for t in f.outputs if t in index.producer]

    def observe(self, feeds, tensors):
        return self._built.observe(feeds, tensors)

    def close(self) -> None:
        self._built.close()
