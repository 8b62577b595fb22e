"""TensorRT as the fused engine, through Polygraphy's loaders only.

Nothing here runs without TensorRT and an NVIDIA GPU; `tensorrt` and
Polygraphy's TensorRT backend are imported inside functions, so importing
this module (and `bisect-tui --help`) costs nothing. This module is the
engine-neutral face (options, refusals, advice, repro); one build is
`buildsteps.py` (the TensorRT calls) over `buildflow.py` (cache, marking
fallback, failures), `buildconfig.py` (CreateConfig), `network.py` (marks,
pins); the built engine is `built.py`. What can be checked without a GPU is
tested on every machine; the rest by `tests/test_tensorrt_gpu.py` and
`scripts/gpu_check.sh` on a GPU box.

Polygraphy API used (checked in the 0.53.6 wheel and NVIDIA/TensorRT
tools/Polygraphy): `NetworkFromOnnxPath(path, mark_unfused_tensors_as_debug_tensors=)`,
`PostprocessNetwork(network, func)`, `CreateConfig(tf32=, fp16=, bf16=, int8=,
precision_constraints=, profiles=, calibrator=, profiling_verbosity=,
memory_pool_limits=, builder_optimization_level=, load_timing_cache=,
progress_monitor=)`, `EngineBytesFromNetwork(network, config, save_timing_cache=)`,
`EngineFromBytes(bytes)`, `Calibrator(data_loader, cache=)`,
`TrtRunner(engine).infer(feed_dict)` (the runner adds captured debug tensors
to its outputs), `G_LOGGER.use_python_logging_system`, and TensorRT's
`engine.create_engine_inspector().get_engine_information(LayerInformationFormat.JSON)`.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Collection, Optional

from bisect_tui.core.errors import EngineBuildError, ExitCode, UserError
from bisect_tui.api import BuildContext, EngineBase, EngineConfig
from bisect_tui.engines.tensorrt import advice
from bisect_tui.engines.tensorrt.buildlog import first_line
from bisect_tui.engines.tensorrt.built import TrtBuilt, TrtObserver
from bisect_tui.engines.tensorrt.cache import EngineCache, engine_versions, timing_cache_path
from bisect_tui.engines.tensorrt.capabilities import INSTALL_HINT, TrtCapabilities, capabilities_for
from bisect_tui.engines.tensorrt.declare import CAPABILITIES, OPTIONS, profile_ranges
from bisect_tui.engines.tensorrt.features import TrtFeatures, detect
from bisect_tui.engines.tensorrt.network import apply_pins, mark_exact, network_layers
from bisect_tui.engines.tensorrt.options import TrtOptions, trt_options, validate
from bisect_tui.engines.tensorrt.sessionfiles import file_sha256, session_cache_dir, session_input_shapes

__all__ = ["TensorRTEngine", "TrtBuilt", "TrtObserver", "apply_pins", "capabilities_for", "describe_build",
           "import_tensorrt", "mark_exact", "network_layers", "session_cache_dir", "session_input_shapes"]


def import_tensorrt():
    """The tensorrt module, or a one-line environment error saying how to get it."""
    try:
        import tensorrt  # noqa: F401
    except Exception as e:  # ImportError, or a CUDA library missing at load time
        raise UserError(f"{INSTALL_HINT} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                        ExitCode.ENVIRONMENT) from None
    return tensorrt


class TensorRTEngine(EngineBase):
    """`--engine tensorrt`: see the module docstring."""

    name = "tensorrt"
    label = "TensorRT"
    library = "tensorrt"
    options = OPTIONS
    capabilities = CAPABILITIES

    def __init__(self, shapes: Optional[dict] = None, cache_dir: Optional[Path] = None, progress=None):
        self.shapes = dict(shapes or {})
        self.cache_dir = Path(cache_dir) if cache_dir else None
        # progress(text) -> False cancels the build; the app or CLI sets it
        self.progress = progress
        # keep-set -> the precision plan a build recorded (this process; others' are read from the caches)
        self._plans: dict = {}
        self._cache_dirs: list = [self.cache_dir] if self.cache_dir else []
        self._features: Optional[TrtFeatures] = None

    # -- what the installed TensorRT can do ---------------------------------
    def features(self) -> TrtFeatures:
        if self._features is None:
            self._features = detect(import_tensorrt())
        return self._features

    def installed_capabilities(self) -> TrtCapabilities:
        """The capability answer in words, for the installed TensorRT (or why none)."""
        try:
            return capabilities_for(self.features())
        except UserError as e:
            return capabilities_for(None, str(e))

    def known_passes(self) -> set[str]:
        return set()  # TensorRT exposes no per-pass switch

    def unknown_passes(self, names: Collection[str]) -> list[str]:
        return list(names)

    def versions(self) -> dict[str, str]:
        import polygraphy

        v = {"polygraphy": polygraphy.__version__}
        try:
            v["tensorrt"] = import_tensorrt().__version__
        except UserError:
            v["tensorrt"] = "not installed"
        return v

    def validate(self, config: EngineConfig) -> None:
        """What can be refused before a build, TensorRT installed or not, without
        the model (INT8 without Q/DQ nodes is refused by `build`, which has it)."""
        validate(trt_options(config))
        profile_ranges(config)
        if config.disabled_passes:
            raise UserError(f"--disable {config.disabled_passes[0]}: TensorRT has no per-pass switch; "
                            "the search marks tensors and pins layers to FP32 instead")
        if config.level not in ("all",):
            raise UserError("TensorRT has one optimization level here (all); use --trt-opt-level for the builder's")

    # -- what a finding means -------------------------------------------------
    def plan_for(self, keep) -> dict:
        """The precision plan recorded for this keep-set: by a build of this
        process, else in a cache a build of this session wrote (a pool worker's,
        a resumed session's), else {}."""
        keep = tuple(sorted(set(keep)))
        if keep not in self._plans:
            for d in self._cache_dirs:
                plan = EngineCache(d).plan_for_keep(keep)
                if plan:
                    self._plans[keep] = plan
                    break
        return self._plans.get(keep, {})

    def _strongly_typed(self) -> Optional[bool]:
        try:
            return self.features().always_strongly_typed
        except UserError:
            return None  # TensorRT not here: advice for both

    def describe(self, config: EngineConfig) -> list[tuple[str, str]]:
        o = trt_options(config)
        lines = [("engine", f"TensorRT via Polygraphy, {o.precision.upper()}"
                  + (", TF32 allowed" if o.tf32 else ""))]
        if o.calibration_cache:
            lines.append(("INT8 calibration cache", o.calibration_cache))
        if o.builder_optimization_level is not None:
            lines.append(("builder optimization level", str(o.builder_optimization_level)))
        if config.keep_fp32:
            lines.append(("kept in FP32", ", ".join(config.keep_fp32)))
            pins = self.plan_for(config.keep_fp32).get("pins")
            if pins:  # the network layers a build pinned for them (names, not a count)
                lines.append(("TensorRT layers pinned to FP32", ", ".join(pins)))
        return lines

    def default_precision(self) -> str:
        """What TensorRT builds with no precision flag: FP32 (TF32 allowed by
        TensorRT's own default; this engine turns TF32 off unless asked)."""
        return "fp32"

    def workaround_text(self, workaround) -> str:
        return advice.workaround_text(workaround, lambda keep: self.plan_for(keep).get("pins") or {},
                                      self._strongly_typed() if workaround.get("kind") == "keep_fp32" else None)

    def write_repro(self, dest: Path, spec) -> list[Path]:
        from bisect_tui.engines.tensorrt.repro import write_repro

        cfg = EngineConfig.from_dict(spec.config)
        opts = trt_options(cfg)
        names = list(spec.extra.get("input_names") or spec.extra.get("inputs") or [])
        workaround = dict(spec.workaround or {})
        if workaround.get("kind") == "keep_fp32" and not workaround.get("layer_precisions"):
            plan = self.plan_for(workaround.get("keep_fp32") or ())
            if plan.get("pins"):
                workaround.update(layer_precisions=dict(plan["pins"]),
                                  output_types=dict(plan.get("output_types") or {}))
        calib = None
        if opts.calibration_cache and Path(opts.calibration_cache).is_file():
            calib = Path(dest) / "calibration.cache"
            Path(dest).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(opts.calibration_cache, calib)
        ranges = {k: [list(s) for s in v] for k, v in profile_ranges(cfg).items()}
        return write_repro(dest, spec, opts.create_config_kwargs(), names, cfg.precision, workaround=workaround,
                           profile_ranges=ranges, calibration_cache=calib.name if calib else None)

    def observer(self, model_path: Path, config: EngineConfig, optimized_path: Optional[str] = None):
        """Debug-tensor observation where the installed TensorRT has it; None otherwise
        (marking outputs would change what TensorRT fuses, so it is no observer)."""
        try:
            feats = self.features()
        except UserError:
            return None
        if not feats.mark_unfused_debug:
            return None
        return TrtObserver(self.build(model_path, config, (), None, observe_debug=True))

    # -- build ---------------------------------------------------------------
    def build(self, model_path: Path, config: EngineConfig, marked: Collection[str] = (),
              workdir: Optional[Path] = None, observe_debug: bool = False, *,
              context: Optional[BuildContext] = None) -> TrtBuilt:
        import onnx

        model_path = Path(model_path)
        if not model_path.exists():
            raise UserError(f"model file not found: {model_path}")
        # refusals first: they hold whatever TensorRT is installed (or none)
        self.validate(config)
        model = onnx.load(str(model_path), load_external_data=False)
        opts = validate(trt_options(config), model)
        trt = import_tensorrt()
        feats = self.features()
        if opts.precision == "int8" and opts.calibration_cache and feats.always_strongly_typed:
            raise UserError(f"TensorRT {feats.version} has no implicit INT8: give a model with Q/DQ nodes "
                            "instead of a calibration cache")
        if opts.precision == "bf16" and feats.always_strongly_typed:
            raise UserError(f"TensorRT {feats.version} takes BF16 only from the model's own types; "
                            "give a BF16 model and --precision fp32")
        # the caller's context first (shapes, cache folder); a build without one (a
        # subgraph, a script) finds its session from the model's place
        ctx_cache = Path(context.cache_dir) / "trt_engines" if context and context.cache_dir else None
        cache_dir = self.cache_dir or ctx_cache or session_cache_dir(model_path, workdir)
        tmpdir = None
        if workdir is None:
            tmpdir = tempfile.TemporaryDirectory(prefix="bisect_tui_trt_")
            workdir = Path(tmpdir.name)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            built = self._prepare(trt, feats, model, model_path, config, opts, list(dict.fromkeys(marked)),
                                  workdir, tmpdir, observe_debug, cache_dir or workdir / "trt_engines", context)
            if not built._dynamic_without_shapes:
                built.ensure()  # build now: build errors belong to build()
            return built
        except BaseException:
            if tmpdir is not None:
                tmpdir.cleanup()
            raise

    def _typed_source(self, feats: TrtFeatures, model_path: Path, opts: TrtOptions, keep: list[str],
                      workdir: Path) -> Path:
        """On strongly typed TensorRT, FP16 comes from the model: convert it,
        leaving the keep-set nodes in FP32 (the converter's node block list)."""
        if not (feats.always_strongly_typed and opts.precision == "fp16"):
            return model_path
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        tag = hashlib.sha256(("\n".join(sorted(keep)) + file_sha256(model_path)).encode()).hexdigest()[:16]
        out = workdir / f"trt_fp16_{tag}.onnx"
        if not out.exists():
            m = onnx.load(str(model_path))
            try:
                conv = convert_float_to_float16(m, keep_io_types=True, node_block_list=sorted(keep) or None)
            except Exception as e:
                raise EngineBuildError(f"could not convert the model to FP16: {first_line(e)}") from None
            onnx.save(conv, str(out))
        return out

    def _prepare(self, trt, feats, model, model_path, config, opts, marked, workdir, tmpdir, observe_debug,
                 cache_dir, context=None):
        import onnx
        import polygraphy

        from bisect_tui.core.model import load_model_info
        from bisect_tui.engines.tensorrt.buildsteps import BuildJob, make_engine
        from bisect_tui.engines.tensorrt.gpu import current_gpu

        keep = sorted(set(config.keep_fp32))
        source = self._typed_source(feats, model_path, opts, keep, workdir)
        info = load_model_info(model_path)
        ranges = profile_ranges(config)
        dynamic = any(not s.is_static for s in info.inputs)
        input_names = {s.name for s in info.inputs}
        # the shapes the triage runs: the session's saved inputs, then what the caller set
        given = dict(context.input_shapes) if context is not None and context.input_shapes else None
        saved = given if given is not None else session_input_shapes(model_path)
        known_shapes = {k: list(v) for k, v in saved.items() if k in input_names}
        known_shapes.update(self.shapes)
        graph_outputs = [o.name for o in model.graph.output]
        parsed = model if source == model_path else onnx.load(str(source), load_external_data=False)
        # tensors of the model TensorRT parses (the FP16 converter may rename around casts)
        existing = {o for n in parsed.graph.node for o in n.output}
        unmarkable = [t for t in marked if t not in existing]
        marked = [t for t in marked if t in existing]
        cache_dir = Path(cache_dir)
        if cache_dir not in self._cache_dirs:
            self._cache_dirs.append(cache_dir)
        versions = engine_versions(feats.version, polygraphy.__version__, current_gpu())
        job = BuildJob(
            trt=trt, feats=feats, source=source, opts=opts, keep=keep,
            node_outputs={n.name: list(n.output) for n in model.graph.node},
            node_types={n.name: n.op_type for n in model.graph.node},
            inputs=list(info.inputs), known_shapes=known_shapes, ranges=ranges, cache=EngineCache(cache_dir),
            source_digest=file_sha256(source), versions=versions, marks=marked,
            debug=bool(observe_debug and feats.mark_unfused_debug),
            timing_cache=timing_cache_path(cache_dir, versions),
            progress=(context.progress if context is not None and context.progress else self.progress),
            pins_seen=self._plans)
        cache_dir.mkdir(parents=True, exist_ok=True)
        built = TrtBuilt(config, model_path, graph_outputs + marked, unmarkable, lambda s: make_engine(job, s),
                         tmpdir)
        built._map_dir = workdir
        built._dynamic_without_shapes = dynamic and not ranges and not all(
            s.name in known_shapes for s in info.inputs if not s.is_static)
        return built


def describe_build(info: dict) -> str:
    """One line for logs and the app: what the last build did."""
    parts = ["reused a cached engine" if info.get("cache_hit") else "built a new engine"]
    if info.get("marking_error"):
        parts.append("marking made the build fail, so it was rebuilt unmarked (region isolation instead): "
                     + info["marking_error"])
    pins = (info.get("precision_plan") or {}).get("pins") or {}
    if pins:
        parts.append(f"{len(pins)} layer(s) pinned to FP32")
    return "; ".join(parts)
