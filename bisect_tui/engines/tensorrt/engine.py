"""TensorRT as the fused engine, through Polygraphy's loaders only.

Nothing here runs without TensorRT and an NVIDIA GPU; `tensorrt` and
Polygraphy's TensorRT backend are imported inside functions, so importing
this module (and `bisect-tui --help`) costs nothing. What can be checked
without a GPU (inspector JSON mapping, FP32 pins, cache keys, profiles,
option refusals, feature detection) lives in the sibling modules and is
tested on every machine; this module is the thin glue, exercised by
`tests/test_tensorrt_gpu.py` and `scripts/gpu_check.sh` on a GPU box.

Polygraphy API used (checked in the 0.53.6 wheel and NVIDIA/TensorRT
tools/Polygraphy): `NetworkFromOnnxPath(path, mark_unfused_tensors_as_debug_tensors=)`,
`PostprocessNetwork(network, func)` (marking by exact name: Polygraphy's
`ModifyNetworkOutputs` reads `* ? [ ]` in names as fnmatch patterns),
`CreateConfig(tf32=, fp16=, bf16=, int8=, precision_constraints=, profiles=,
calibrator=, profiling_verbosity=, memory_pool_limits=, builder_optimization_level=)`,
`EngineBytesFromNetwork(network, config)`, `EngineFromBytes(bytes)`,
`Calibrator(data_loader, cache=)`, `TrtRunner(engine).infer(feed_dict)`
(the runner adds captured debug tensors to its outputs), and TensorRT's
`engine.create_engine_inspector().get_engine_information(LayerInformationFormat.JSON)`.
"""

from __future__ import annotations

import hashlib
import tempfile
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Collection, Optional, Sequence

import numpy as np

from bisect_tui.core.errors import EngineBuildError, EngineRunError, ExitCode, UserError
from bisect_tui.api import EngineConfig, FusedNode
from bisect_tui.engines.tensorrt.cache import EngineCache, cache_key
from bisect_tui.engines.tensorrt.features import TrtFeatures, detect
from bisect_tui.engines.tensorrt.declare import CAPABILITIES, OPTIONS, profile_ranges, trt_options
from bisect_tui.engines.tensorrt.inspector import fused_nodes_from_inspector, fusions_across, parse_inspector
from bisect_tui.engines.tensorrt.options import TrtOptions, validate
from bisect_tui.engines.tensorrt.precision import NetworkLayer, PrecisionPlan, plan_keep_fp32
from bisect_tui.engines.tensorrt.profiles import build_profiles, to_polygraphy

INSTALL_HINT = (
    "TensorRT is not installed: on a machine with an NVIDIA GPU run "
    "`pip install -e '.[tensorrt]'` (or scripts/gpu_check.sh)"
)


@dataclass
class TrtCapabilities:
    """What the installed TensorRT lets a bisection do, in user words."""

    available: bool
    reason: str = ""
    marking: str = "network outputs (breaks fusion at the marked tensor)"
    observation: str = ""
    keep_fp32: str = ""
    disable_passes: str = "not available: TensorRT has no per-pass switch; use marking or FP32 pins"
    on_marking_failure: str = (
        "when marking makes the build fail, the engine is rebuilt unmarked and the bisection "
        "falls back to region isolation (the failing marks are reported)"
    )
    features: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def capabilities_for(features: Optional[TrtFeatures], reason: str = "") -> TrtCapabilities:
    if features is None:
        return TrtCapabilities(available=False, reason=reason or INSTALL_HINT)
    if features.mark_unfused_debug:
        obs = "debug tensors (mark_unfused_tensors_as_debug_tensors): fusion is kept, fused-away tensors are absent"
    elif features.mark_debug:
        obs = "marked debug tensors (mark_debug): may block fusion at the marked tensors"
    else:
        obs = "network outputs: blocks fusion at the observed tensors"
    if features.layer_precisions:
        keep = "layer precisions pinned to FP32 with obeyed precision constraints"
    else:
        keep = "strongly typed network: the keep-set nodes stay FP32 when the model is converted to FP16"
    return TrtCapabilities(available=True, observation=obs, keep_fp32=keep, features=features.to_dict())


def import_tensorrt():
    """The tensorrt module, or a one-line environment error saying how to get it."""
    try:
        import tensorrt  # noqa: F401
    except Exception as e:  # ImportError, or a CUDA library missing at load time
        raise UserError(f"{INSTALL_HINT} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                        ExitCode.ENVIRONMENT) from None
    return tensorrt


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def session_cache_dir(model_path: Path, workdir: Optional[Path] = None) -> Optional[Path]:
    """Where built engines are cached: the session's `engines/trt_engines`.

    The search builds marked engines without a workdir and isolates subgraphs
    written inside the session, so the session is found from the model's
    place (the nearest folder above it holding `session.json`, a real file,
    at most four levels up). Outside a session the workdir holds them; with
    neither, nothing is cached (None)."""
    root = _session_root(model_path)
    if root is not None:
        return root / "engines" / "trt_engines"
    return Path(workdir) / "trt_engines" if workdir is not None else None


def _session_root(model_path: Path) -> Optional[Path]:
    here = Path(model_path).resolve().parent
    for d in [here, *list(here.parents)[:4]]:
        meta = d / "session.json"
        if meta.is_file() and not meta.is_symlink():
            return d
    return None


def session_input_shapes(model_path: Path) -> dict:
    """Shapes of the session's saved inputs (`input.npz`, arrays stored as
    `(samples, *shape)`), read from the .npy headers only: nothing is loaded,
    nothing unpickled. {} outside a session or when the file is unreadable."""
    import zipfile

    root = _session_root(model_path)
    if root is None:
        return {}
    path = root / "input.npz"
    if not path.is_file() or path.is_symlink():
        return {}
    shapes = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    if version == (1, 0):
                        shape, _, _ = np.lib.format.read_array_header_1_0(fh)
                    else:
                        shape, _, _ = np.lib.format.read_array_header_2_0(fh)
                if len(shape) >= 1:
                    shapes[info.filename[:-4]] = [int(d) for d in shape[1:]]
    except (OSError, ValueError, zipfile.BadZipFile):
        return {}
    return shapes


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- network edits (duck-typed over TensorRT's INetworkDefinition, whose Python
# API Polygraphy's own loaders use: iteration over layers, num_inputs/get_input,
# layer.num_outputs/get_output, tensor.is_network_output, mark_output,
# layer.precision, layer.set_output_type)


def _network_tensors(network) -> dict:
    tensors = {}
    for i in range(network.num_inputs):
        t = network.get_input(i)
        if t is not None:
            tensors[t.name] = t
    for layer in network:
        for k in range(layer.num_outputs):
            t = layer.get_output(k)
            if t is not None:
                tensors[t.name] = t
    return tensors


def mark_exact(network, marks) -> list:
    """Mark tensors as network outputs by exact name; returns the names not found."""
    tensors = _network_tensors(network)
    missing = [m for m in marks if m not in tensors]
    if not missing:
        for m in marks:
            if not tensors[m].is_network_output:
                network.mark_output(tensors[m])
    return missing


def network_layers(network) -> list:
    layers = []
    for layer in network:
        outs = [layer.get_output(i) for i in range(layer.num_outputs)]
        outs = [t for t in outs if t is not None]
        layers.append(NetworkLayer(
            name=layer.name,
            outputs=tuple(t.name for t in outs),
            output_types=tuple(str(t.dtype).split(".")[-1].upper() for t in outs),
            metadata=str(getattr(layer, "metadata", "") or ""),
            layer_type=str(layer.type).split(".")[-1]))
    return layers


def apply_pins(network, pins, float32) -> int:
    """Set FP32 compute and output types on the pinned layers; returns how many."""
    n = 0
    for layer in network:
        if layer.name in pins:
            layer.precision = float32
            for i in range(layer.num_outputs):
                layer.set_output_type(i, float32)
            n += 1
    return n


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
        if info["dropped_marks"]:  # marking broke the build: rebuilt unmarked
            self.unmarkable = list(dict.fromkeys(self.unmarkable + info["dropped_marks"]))
            self.output_names = [n for n in self.output_names if n not in info["dropped_marks"]]
        self._runner = TrtRunner(engine)
        self._runner.activate()

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
            raise EngineRunError(f"TensorRT failed running the engine: {_first_line(e)}", _first_line(e)) from None
        want = set(self.output_names if names is None else names) & set(self.output_names)
        return {k: np.array(v) for k, v in out.items() if k in want}

    def observe(self, feeds: dict[str, np.ndarray], tensors) -> dict[str, np.ndarray]:
        """Debug tensors captured by the runner's listener (engines built with
        unfused tensors marked as debug tensors), under their ONNX names."""
        self.ensure({k: list(np.shape(v)) for k, v in feeds.items()})
        try:
            out = self._runner.infer(feed_dict=dict(feeds))
        except Exception as e:
            raise EngineRunError(f"TensorRT failed running the engine: {_first_line(e)}", _first_line(e)) from None
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


class TensorRTEngine:
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
        self._pins_by_keep: dict = {}  # keep-set -> {layer: "fp32"} of the last build that pinned it

    # -- what the installed TensorRT can do ---------------------------------
    def features(self) -> TrtFeatures:
        return detect(import_tensorrt())

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
        """What can be refused before a build, TensorRT installed or not."""
        validate(trt_options(config))
        profile_ranges(config)
        if config.disabled_passes:
            raise UserError(f"--disable {config.disabled_passes[0]}: TensorRT has no per-pass switch; "
                            "the search marks tensors and pins layers to FP32 instead")
        if config.level not in ("all",):
            raise UserError("TensorRT has one optimization level here (all); use --trt-opt-level for the builder's")

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
            pins = self._pins_by_keep.get(tuple(sorted(config.keep_fp32)))
            if pins:  # the network layers the last build pinned for them (names, not a count)
                lines.append(("TensorRT layers pinned to FP32", ", ".join(pins)))
        return lines

    def default_precision(self) -> str:
        """What TensorRT builds with no precision flag: FP32 (TF32 allowed by
        TensorRT's own default; this engine turns TF32 off unless asked)."""
        return "fp32"

    def workaround_text(self, workaround) -> str:
        kind = workaround.get("kind")
        if kind == "keep_fp32":
            layers = workaround.get("layer_precisions") or {}
            keep = tuple(sorted(workaround.get("keep_fp32") or ()))
            if not layers and keep:  # the pins the last build with this keep-set made
                layers = self._pins_by_keep.get(keep, {})
            if layers:
                pins = " ".join(f"{name}:float32" for name in layers)
                return ("polygraphy convert model.onnx --fp16 --precision-constraints obey --layer-precisions "
                        + pins + " -o model.engine")
            return ("keep the nodes in FP32 in the ONNX model (convert_float_to_float16(node_block_list=...)) "
                    "before TensorRT parses it (TensorRT 11 takes precisions from the model's types)")
        if kind == "precision":
            return (f"build with --precision {workaround.get('precision', 'fp32')} "
                    "(Polygraphy CreateConfig without the reduced-precision flag)")
        if kind == "mark_outputs":
            return ("mark " + ", ".join(workaround.get("marked_tensors") or []) + " as network outputs "
                    "(Polygraphy ModifyNetworkOutputs / --trt-outputs): TensorRT stops fusing there")
        return "no TensorRT setting was proven to fix it"

    def write_repro(self, dest: Path, spec) -> list[Path]:
        from bisect_tui.engines.tensorrt.repro import write_repro

        cfg = EngineConfig.from_dict(spec.config)
        kwargs = trt_options(cfg).create_config_kwargs()
        names = list(spec.extra.get("input_names") or spec.extra.get("inputs") or [])
        return write_repro(dest, spec, kwargs, names, cfg.precision)

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
              workdir: Optional[Path] = None, observe_debug: bool = False) -> TrtBuilt:
        import onnx

        model_path = Path(model_path)
        if not model_path.exists():
            raise UserError(f"model file not found: {model_path}")
        # refusals first: they hold whatever TensorRT is installed (or none)
        self.validate(config)
        model = onnx.load(str(model_path), load_external_data=False)
        opts = validate(trt_options(config), model)
        trt = import_tensorrt()
        feats = detect(trt)
        if opts.precision == "int8" and opts.calibration_cache and feats.always_strongly_typed:
            raise UserError(f"TensorRT {feats.version} has no implicit INT8: give a model with Q/DQ nodes "
                            "instead of a calibration cache")
        if opts.precision == "bf16" and feats.always_strongly_typed:
            raise UserError(f"TensorRT {feats.version} takes BF16 only from the model's own types; "
                            "give a BF16 model and --precision fp32")
        cache_dir = self.cache_dir or session_cache_dir(model_path, workdir)
        tmpdir = None
        if workdir is None:
            tmpdir = tempfile.TemporaryDirectory(prefix="bisect_tui_trt_")
            workdir = Path(tmpdir.name)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            built = self._prepare(trt, feats, model, model_path, config, opts, list(dict.fromkeys(marked)),
                                  workdir, tmpdir, observe_debug, cache_dir or workdir / "trt_engines")
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

        tag = hashlib.sha256(("\n".join(sorted(keep)) + _file_sha256(model_path)).encode()).hexdigest()[:16]
        out = workdir / f"trt_fp16_{tag}.onnx"
        if not out.exists():
            m = onnx.load(str(model_path))
            try:
                conv = convert_float_to_float16(m, keep_io_types=True, node_block_list=sorted(keep) or None)
            except Exception as e:
                raise EngineBuildError(f"could not convert the model to FP16: {_first_line(e)}") from None
            onnx.save(conv, str(out))
        return out

    def _prepare(self, trt, feats, model, model_path, config, opts, marked, workdir, tmpdir, observe_debug,
                 cache_dir):
        import onnx
        from polygraphy.backend.trt import (
            Calibrator,
            CreateConfig,
            EngineBytesFromNetwork,
            EngineFromBytes,
            NetworkFromOnnxPath,
            PostprocessNetwork,
        )
        from polygraphy.exception import PolygraphyException

        from bisect_tui.core.model import load_model_info

        keep = sorted(set(config.keep_fp32))
        source = self._typed_source(feats, model_path, opts, keep, workdir)
        info = load_model_info(model_path)
        ranges = profile_ranges(config)
        dynamic = any(not s.is_static for s in info.inputs)
        input_names = {s.name for s in info.inputs}
        # the shapes the triage runs: the session's saved inputs, then what the caller set
        known_shapes = {k: v for k, v in session_input_shapes(model_path).items() if k in input_names}
        known_shapes.update(self.shapes)
        graph_outputs = [o.name for o in model.graph.output]
        parsed = model if source == model_path else onnx.load(str(source), load_external_data=False)
        # tensors of the model TensorRT parses (the FP16 converter may rename around casts)
        existing = {o for n in parsed.graph.node for o in n.output}
        unmarkable = [t for t in marked if t not in existing]
        marked = [t for t in marked if t in existing]
        node_outputs = {n.name: list(n.output) for n in model.graph.node}
        debug = observe_debug and feats.mark_unfused_debug
        versions = {"tensorrt": feats.version, "polygraphy": self.versions()["polygraphy"]}
        cache = EngineCache(cache_dir)
        source_digest = _file_sha256(source)

        def make_network(marks, plan_box):
            net = NetworkFromOnnxPath(str(source), mark_unfused_tensors_as_debug_tensors=debug or None)
            if marks:
                # not ModifyNetworkOutputs: it reads names holding * ? [ ] as fnmatch
                # patterns, and tensor names are data; mark by exact name instead
                def mark(network, marks=tuple(marks)):
                    missing = mark_exact(network, marks)
                    if missing:
                        raise PolygraphyException(f"tensor {missing[0]!r} is not in the TensorRT network")
                net = PostprocessNetwork(net, mark, name="MarkTensors")
            if keep and feats.layer_precisions:
                def pin(network):
                    plan = plan_keep_fp32(network_layers(network), keep, node_outputs, strongly_typed=False)
                    plan_box["plan"] = plan
                    apply_pins(network, plan.pins, trt.float32)
                net = PostprocessNetwork(net, pin, name="KeepFp32")
            return net

        def make(shapes):
            specs = build_profiles(info.inputs, {**known_shapes, **(shapes or {})}, ranges)
            kwargs = opts.create_config_kwargs()
            if not feats.obey_precision_constraints:
                kwargs.pop("precision_constraints")
            if feats.always_strongly_typed:  # precision comes from the model's types
                for k in ("fp16", "bf16", "int8"):
                    kwargs[k] = False
            kwargs["profiles"] = to_polygraphy(specs)
            kwargs["profiling_verbosity"] = trt.ProfilingVerbosity.DETAILED
            if opts.workspace_mb:
                kwargs["memory_pool_limits"] = {trt.MemoryPoolType.WORKSPACE: opts.workspace_mb << 20}
            if self.progress is not None:
                from bisect_tui.engines.tensorrt.progress import make_monitor

                monitor = make_monitor(trt, self.progress)
                if monitor is not None:
                    kwargs["progress_monitor"] = monitor
            if opts.precision == "int8" and opts.calibration_cache:
                kwargs["calibrator"] = Calibrator(data_loader=[], cache=str(opts.calibration_cache))
            options_key = {**opts.to_dict(), "profiles": [asdict(s) for s in specs]}

            def once(marks):
                plan_box: dict = {}
                key = cache_key(source_digest, options_key, marks, keep, (), "debug" if debug else "outputs",
                                versions)
                data = cache.get(key)
                hit = data is not None
                if data is None:
                    data = bytes(EngineBytesFromNetwork(make_network(marks, plan_box),
                                                        config=CreateConfig(**kwargs))())
                    record = {"model": source.name, "marked": len(marks), "keep_fp32": keep}
                    if plan_box.get("plan"):
                        record["precision_plan"] = plan_box["plan"].to_dict()
                    cache.put(key, data, record)
                return EngineFromBytes(data)(), hit, plan_box.get("plan")

            marking_error, dropped = "", []
            try:
                try:
                    engine, hit, plan = once(marked)
                except PolygraphyException as e:
                    if not marked:
                        raise
                    # marking broke the build: say so, rebuild unmarked, let the search isolate regions
                    marking_error, dropped = _first_line(e), list(marked)
                    engine, hit, plan = once([])
            except PolygraphyException as e:
                raise EngineBuildError(f"TensorRT could not build the engine: {_first_line(e)}",
                                       _first_line(e)) from None
            doc = None
            if feats.engine_inspector:
                inspector = engine.create_engine_inspector()
                doc = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
            if plan is None:
                plan = plan_keep_fp32([], keep, node_outputs, feats.always_strongly_typed)
            if plan.pins:
                self._pins_by_keep[tuple(keep)] = dict(plan.pins)
            return engine, {"inspector": doc, "marking_error": marking_error, "plan": plan, "cache_hit": hit,
                            "dropped_marks": dropped}

        built = TrtBuilt(config, model_path, graph_outputs + marked, unmarkable, make, tmpdir)
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
