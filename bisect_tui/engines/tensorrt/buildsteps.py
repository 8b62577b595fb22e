"""The TensorRT half of one build, through Polygraphy's loaders only:
`NetworkFromOnnxPath` -> `PostprocessNetwork` (marks by exact name, FP32
pins) -> `CreateConfig` -> `EngineBytesFromNetwork` -> `EngineFromBytes`, then
`IEngineInspector.get_engine_information(LayerInformationFormat.JSON)`.

Runs only with TensorRT on a GPU (`tests/test_tensorrt_gpu.py`); what it
decides is in the modules it calls (buildflow, buildconfig, network,
precision), which are tested everywhere."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from bisect_tui.engines.tensorrt.buildconfig import create_config_kwargs
from bisect_tui.engines.tensorrt.buildflow import build_engine
from bisect_tui.engines.tensorrt.cache import EngineCache, cache_key
from bisect_tui.engines.tensorrt.network import apply_pins, mark_exact, network_layers
from bisect_tui.engines.tensorrt.precision import plan_keep_fp32
from bisect_tui.engines.tensorrt.profiles import build_profiles


@dataclass
class BuildJob:
    trt: Any
    feats: Any  # TrtFeatures
    source: Path  # the ONNX file TensorRT parses (FP16-converted on TensorRT 11)
    opts: Any  # TrtOptions
    keep: list
    node_outputs: dict  # every ONNX node -> its outputs
    node_types: dict  # every ONNX node -> its op type
    inputs: list  # the model's InputSpecs
    known_shapes: dict
    ranges: dict
    cache: EngineCache
    source_digest: str
    versions: dict
    marks: list = field(default_factory=list)  # tensors to mark as outputs
    debug: bool = False
    timing_cache: Optional[Path] = None
    progress: Optional[Callable] = None
    pins_seen: dict = field(default_factory=dict)  # keep-set -> plan dict, filled by builds


def _network(job: BuildJob, marks: list, box: dict):
    from polygraphy.backend.trt import NetworkFromOnnxPath, PostprocessNetwork

    net = NetworkFromOnnxPath(str(job.source), mark_unfused_tensors_as_debug_tensors=job.debug or None)
    if marks:
        def mark(network, marks=tuple(marks)):
            box["missing"] = mark_exact(network, marks)
        net = PostprocessNetwork(net, mark, name="MarkTensors")
    if job.keep and job.feats.layer_precisions:
        def pin(network):
            plan = plan_keep_fp32(network_layers(network), job.keep, job.node_outputs, strongly_typed=False,
                                  node_types=job.node_types)
            box["plan"] = plan
            apply_pins(network, plan, job.trt.float32)
        net = PostprocessNetwork(net, pin, name="KeepFp32")
    return net


def make_engine(job: BuildJob, shapes: Optional[dict]):
    """Build (or reuse) the engine for `shapes`; returns (engine, info dict)."""
    from polygraphy.backend.trt import Calibrator, CreateConfig, EngineBytesFromNetwork, EngineFromBytes

    specs = build_profiles(job.inputs, {**job.known_shapes, **(shapes or {})}, job.ranges)
    monitor = None
    if job.progress is not None:
        from bisect_tui.engines.tensorrt.progress import make_monitor

        monitor = make_monitor(job.trt, job.progress)
    calibrator = None
    if job.opts.precision == "int8" and job.opts.calibration_cache:
        calibrator = Calibrator(data_loader=[], cache=str(job.opts.calibration_cache))
    kwargs = create_config_kwargs(job.opts, job.feats, specs, job.trt, monitor, job.timing_cache, calibrator)
    options_key = {**job.opts.to_dict(), "profiles": [asdict(s) for s in specs]}
    observe = "debug" if job.debug else "outputs"

    def key_for(marks):
        return cache_key(job.source_digest, options_key, marks, job.keep, (), observe, job.versions)

    def build_bytes(marks, box):
        save = str(job.timing_cache) if job.timing_cache is not None else None
        return EngineBytesFromNetwork(_network(job, marks, box), config=CreateConfig(**kwargs),
                                      save_timing_cache=save)()

    def cancelled() -> bool:
        return bool(monitor is not None and monitor.state.cancelled)

    out = build_engine(job.cache, key_for, job.marks, build_bytes, lambda data: EngineFromBytes(data)(), cancelled,
                       {"model": job.source.name, "keep_fp32": list(job.keep)})
    doc = None
    if job.feats.engine_inspector:
        inspector = out.engine.create_engine_inspector()
        doc = inspector.get_engine_information(job.trt.LayerInformationFormat.JSON)
    plan = out.plan
    if plan is None:
        plan = plan_keep_fp32([], job.keep, job.node_outputs, job.feats.always_strongly_typed)
    if plan.pins:
        job.pins_seen[tuple(job.keep)] = plan.to_dict()
    return out.engine, {"inspector": doc, "marking_error": out.marking_error, "plan": plan,
                        "cache_hit": out.cache_hit, "dropped_marks": out.dropped_marks,
                        "missing_marks": out.missing_marks}
