"""OpenVINO as the fused engine (CPU here).

Facts this module relies on (checked on openvino 2026.4.1, see the project
notes on OpenVINO):

* The CPU plugin picks its own inference precision: bf16 on a CPU with
  AVX-512 BF16, even when the user never asked. So every build passes
  `INFERENCE_PRECISION_HINT` for the precision asked, and `precision_used`
  reads back what the compiled model really runs.
* Marking is `model.add_outputs([...])` before compiling. It usually stops a
  fusion, but not always: for some patterns the plugin keeps the marked
  computations for the extra outputs and still fuses the main path. So
  `fusions_across` says, from the runtime graph of a marked build, which
  fused layers still hide a marked tensor; the search then judges those
  regions in isolation instead of trusting the marking.
* The executed graph is `compiled.get_runtime_model()`; each op's rt_info
  holds `layerType` and `originalLayersNames` (node names, sometimes the name
  of a graph output tensor). The list can be incomplete when a pattern was
  replaced early (a whole normalization turned into one MVN), so nodes the
  list misses are mapped by topology: an original node whose every consumer
  lies in one layer belongs to that layer.
* Release builds have no per-pass switch: the workaround is a marking (the
  `mark` option, proven by a rebuild) or the precision setting.

openvino is imported inside functions: `bisect-tui --help` stays fast.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Collection, Iterable, Optional, Sequence

import numpy as np

from bisect_tui.api import (BuildContext, EngineBase, EngineBuildError, EngineConfig, EngineRunError, FusedNode,
                            ReproSpec, UserError, did_you_mean)

from bisect_tui.engines.openvino.declare import _HINTS, CAPABILITIES, LABEL, OPTIONS, OV_PRECISIONS
from bisect_tui.engines.openvino.runtime_graph import (  # noqa: F401  (importable from here)
    fused_node_map,
    interior_tensors,
    precision_name,
    runtime_layers,
)

def import_openvino():
    """openvino, without the telemetry it sends on import: its package falls back
    to its own no-op stub when `openvino_telemetry` cannot be imported, which is
    the switch the library offers a program (its opt-out otherwise writes the
    user's home). The sender forked a child on import that outlived our commands."""
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)
    import openvino

    return openvino


def _core():
    ov = import_openvino()

    core = getattr(_core, "_cached", None)
    if core is None:
        core = ov.Core()
        _core._cached = core
    return core


_VALUE_CHECKS: dict = {}


def _rejected_value(core, device: str, key: str, value: str) -> str:
    """Why the plugin refuses `key=value`, or "" (a one-op model compiled with it,
    once per value). set_property accepts anything; only compiling tells, and a
    refusal at the model's build read as "the fused engine breaks tolerance"."""
    hit = _VALUE_CHECKS.get((device, key, value))
    if hit is None:
        import numpy as np

        ov = import_openvino()
        from openvino import opset13 as ops

        p = ops.parameter([1, 4], np.float32)
        try:
            core.compile_model(ov.Model([ops.relu(p)], [p]), device, {key: value})
            hit = ""
        except Exception as e:  # the plugin's own words
            hit = _first_line(e)
        _VALUE_CHECKS[(device, key, value)] = hit
    return hit


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("Check ", "Exception from")):
            return line[:300]
    return (text.splitlines()[0][:300] if text else type(e).__name__)


def _full_text(e: BaseException) -> str:
    """OpenVINO's whole message, without the C++ call-site lines ("Exception from
    src/...") that carry no cause: its first line alone can stop at "FrontEnd API
    failed with OpConversionFailure:", the causes (each failed op and why) follow."""
    lines = [line.rstrip() for line in str(e).strip().splitlines()]
    kept = [line for line in lines if not line.startswith("Exception from src/")]
    return "\n".join(kept).strip() or type(e).__name__


def _short(e: BaseException) -> str:
    """One line that says what failed: the first meaningful line, and when it ends
    in a colon (the cause is below), the ops that failed and the first cause."""
    first = _first_line(e)
    if not first.endswith(":"):
        return first
    lines = [line.strip() for line in _full_text(e).splitlines() if line.strip()]
    summary = next((line[len("-- "):] for line in lines if line.startswith("-- Conversion is failed for")), "")
    causes = [line for line in lines if not line.startswith(("Check ", "While validating", "FrontEnd API",
                                                             "-- ", "Summary:", "Model wasn't"))]
    tail = "; ".join(x for x in (summary, causes[0] if causes else "") if x)
    return f"{first} {tail}"[:300] if tail else first


def _build_error(what: str, e: BaseException) -> EngineBuildError:
    return EngineBuildError(f"OpenVINO could not {what}: {_short(e)}", _short(e), _full_text(e))


def marked_option(config: EngineConfig) -> list[str]:
    """The `mark` option (a JSON list: tensor names are data, commas allowed)."""
    raw = config.option("mark")
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        return [raw]
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


class OvBuilt:
    """A compiled OpenVINO model plus its runtime graph."""

    def __init__(self, compiled, config: EngineConfig, source_path: Path, output_names: list[str],
                 ports: dict[str, int], unmarkable: list[str], marked: list[str], layers_path: Path,
                 layers: list[dict], tmpdir: Optional[tempfile.TemporaryDirectory]):
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self.config = config
        self.source_path = source_path
        self.output_names = output_names
        self._ports = ports
        self.unmarkable = unmarkable
        self.marked = marked
        self.optimized_model_path: Optional[Path] = layers_path
        self.layers = layers
        self._fused: Optional[list[FusedNode]] = None
        self._original = None
        self._tmpdir = tmpdir
        if tmpdir is not None:
            self._finalizer = weakref.finalize(self, tmpdir.cleanup)

    def _onnx(self):
        if self._original is None:
            from bisect_tui.core.onnx_files import ensure_named as _ensure_named, load_model as _load

            self._original = _ensure_named(_load(self.source_path, load_external=False))
        return self._original

    @property
    def fused_nodes(self) -> list[FusedNode]:
        if self._fused is None:
            self._fused = fused_node_map(self._onnx(), self.layers)
        return self._fused

    def run(self, feeds: dict[str, np.ndarray], names: Optional[Sequence[str]] = None) -> dict[str, np.ndarray]:
        if self._compiled is None:
            raise RuntimeError("engine is closed")
        try:
            # np.require, not np.ascontiguousarray: that one turns a 0-d input (Silero's `sr`) into shape [1]
            result = self._request.infer({k: np.require(v, requirements="C") for k, v in feeds.items()})
        except Exception as e:  # built, then failed on these inputs: a finding
            raise EngineRunError(f"OpenVINO failed to run the model: {_short(e)}", _short(e), _full_text(e)) \
                from None
        values = list(result.values())
        want = None if names is None else set(names)
        return {name: np.array(values[i]) for name, i in self._ports.items() if want is None or name in want}

    def observe(self, feeds: dict[str, np.ndarray], tensors: Sequence[str]) -> dict[str, np.ndarray]:
        obs = OvObserver(self.source_path, self.config, self.layers)
        try:
            return obs.observe(feeds, tensors)
        finally:
            obs.close()

    def fusions_across(self, marks: Collection[str]) -> list[FusedNode]:
        """Fused layers that still compute a marked tensor inside themselves."""
        marks = set(marks)
        if not marks:
            return []
        original = self._onnx()
        shared = fused_node_map(original, self.layers, allow_shared=True)
        return [fn for fn in shared if len(fn.original_nodes) > 1 and interior_tensors(fn, original) & marks]

    def precision_used(self) -> str:
        try:
            return precision_name(self._compiled.get_property("INFERENCE_PRECISION_HINT"))
        except Exception:
            return self.config.precision

    def close(self) -> None:
        self._request = None
        self._compiled = None
        if self._tmpdir is not None:
            self._finalizer()
            self._tmpdir = None
            self.optimized_model_path = None


class OvObserver:
    """The fused program's own tensors: outputs added only at layer boundaries
    of the unmarked build (marking those undoes no fusion). One compile per
    tensor group; tensors whose marking would change the runtime graph are left out."""

    def __init__(self, model_path: Path, config: EngineConfig, layers: list[dict]):
        from bisect_tui.core.onnx_files import ensure_named as _ensure_named, load_model as _load

        self.model_path = Path(model_path)
        self.config = config
        original = _ensure_named(_load(self.model_path, load_external=False))
        self.tensors = list(dict.fromkeys(t for fn in fused_node_map(original, layers) for t in fn.outputs))
        self._group: Optional[tuple[str, ...]] = None
        self._built: Optional[OvBuilt] = None

    def observe(self, feeds: dict[str, np.ndarray], tensors: Sequence[str]) -> dict[str, np.ndarray]:
        group = tuple(t for t in tensors if t in set(self.tensors))
        if group != self._group:
            self.close()
            self._built = OpenVinoEngine().build(self.model_path, self.config, group)
            self._group = group
        assert self._built is not None
        values = self._built.run(feeds)
        return {t: values[t] for t in group if t in values}

    def close(self) -> None:
        if self._built is not None:
            self._built.close()
        self._built = None
        self._group = None


# --------------------------------------------------------------------------- engine


class OpenVinoEngine(EngineBase):
    """OpenVINO engine (see the module docstring for the facts it relies on)."""

    name = "openvino"
    label = LABEL
    library = "openvino"
    options = OPTIONS
    capabilities = CAPABILITIES

    @staticmethod
    def device(config: EngineConfig) -> str:
        return config.option("device", "CPU") or "CPU"

    def validate(self, config: EngineConfig) -> None:
        if config.level != "all":
            raise UserError(f"OpenVINO has no optimization levels (got --level {config.level}); "
                            "leave --level at its default")
        if config.precision not in OV_PRECISIONS:
            raise UserError(f"precision {config.precision!r}: OpenVINO runs {', '.join(OV_PRECISIONS)}")
        for what, value in (("--disable", config.disabled_passes), ("--keep-fp32", config.keep_fp32)):
            if value:
                raise UserError(f"{what}: OpenVINO release builds have no per-pass or per-node switch; "
                                "use --ov-mark or --precision instead")
        foreign = sorted(set(dict(config.options)) - {o.option_key for o in OPTIONS})
        if foreign:
            raise UserError(f"option {foreign[0]!r} is not one of OpenVINO's; OpenVINO uses "
                            + ", ".join(o.flag for o in OPTIONS))
        try:
            core = _core()
        except Exception as e:  # not installed, or a broken install
            raise UserError(f"OpenVINO is not available: {_first_line(e)}; pip install 'openvino>=2025.1,<2027'") \
                from None
        device = self.device(config)
        devices = list(core.available_devices)
        if device not in devices:
            raise UserError(f"--ov-device {device}: not available here; available: {', '.join(devices)}"
                            + did_you_mean(device, devices))
        supported = core.get_property(device, "SUPPORTED_PROPERTIES")
        writable = {k for k, v in dict(supported).items() if str(v) != "RO"}
        for key, _ in config.config_entries:
            if key == "INFERENCE_PRECISION_HINT":
                raise UserError("--ov-config INFERENCE_PRECISION_HINT: set it with --precision "
                                f"({', '.join(OV_PRECISIONS)})")
            if key not in writable:
                raise UserError(f"--ov-config {key}: OpenVINO's {device} plugin does not accept this property"
                                + did_you_mean(key, writable))
        for key, value in config.config_entries:
            problem = _rejected_value(core, device, key, value)
            if problem:
                raise UserError(f"--ov-config {key}={value}: OpenVINO's {device} plugin rejects this value "
                                f"({problem})")

    def default_precision(self, device: str = "CPU") -> Optional[str]:
        """The precision the plugin picks when none is asked (bf16 on CPUs with AVX-512 BF16)."""
        try:
            return precision_name(_core().get_property(device, "INFERENCE_PRECISION_HINT"))
        except Exception:
            return None

    def properties(self, config: EngineConfig) -> dict[str, str]:
        return {"INFERENCE_PRECISION_HINT": _HINTS[config.precision],
                **{k: v for k, v in config.config_entries}}

    def build(self, model_path: Path, config: EngineConfig, marked: Collection[str] = (),
              workdir: Optional[Path] = None, *, context: Optional[BuildContext] = None) -> OvBuilt:
        """Compile `model_path` with `marked` tensors (and the `mark` option) added as outputs."""
        model_path = Path(model_path)
        self.validate(config)
        if not model_path.exists():
            raise UserError(f"model file not found: {model_path}")
        tmpdir = None
        if workdir is None:
            tmpdir = tempfile.TemporaryDirectory(prefix="bisect_tui_ov_")
            workdir = Path(tmpdir.name)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            return self._build(model_path, config, list(marked), workdir, tmpdir)
        except BaseException:
            if tmpdir is not None:
                tmpdir.cleanup()
            raise

    def _build(self, model_path: Path, config: EngineConfig, marked: list[str], workdir: Path,
               tmpdir) -> OvBuilt:
        core = _core()
        try:
            model = core.read_model(str(model_path))
        except Exception as e:
            raise _build_error("read the model", e) from None
        graph_outputs = []
        for port in model.outputs:
            names = sorted(port.get_names())
            graph_outputs.append(names[0] if names else port.get_any_name())
        graph_outputs = self._onnx_output_order(model_path, graph_outputs)
        existing = {n for op in model.get_ops() for out in op.outputs() for n in out.get_names()}
        wanted = list(dict.fromkeys([t for t in marked if t] + marked_option(config)))
        wanted = [t for t in wanted if t not in graph_outputs]
        markable = [t for t in wanted if t in existing]
        unmarkable = [t for t in wanted if t not in existing]
        if markable:
            try:
                model.add_outputs(markable)
            except Exception:
                ok = []
                for t in markable:  # one by one: keep what OpenVINO accepts
                    try:
                        model.add_outputs([t])
                        ok.append(t)
                    except Exception:
                        unmarkable.append(t)
                markable = ok
        try:
            compiled = core.compile_model(model, self.device(config), self.properties(config))
        except Exception as e:
            raise _build_error("compile the model", e) from None
        ports: dict[str, int] = {}
        for i, port in enumerate(compiled.outputs):
            for n in port.get_names():
                if (n in graph_outputs or n in markable) and n not in ports:
                    ports[n] = i
        names = [n for n in graph_outputs + markable if n in ports]
        layers = runtime_layers(compiled)
        key = hashlib.sha1(json.dumps({"config": config.key(), "marked": sorted(markable)}).encode()).hexdigest()[:12]
        layers_path = workdir / f"runtime_{key}.json"
        from bisect_tui.core import atomic

        atomic.write_json(layers_path, {"engine": "openvino", "layers": layers})
        return OvBuilt(compiled, config, model_path, names, {n: ports[n] for n in names}, unmarkable, markable,
                       layers_path, layers, tmpdir)

    @staticmethod
    def _onnx_output_order(model_path: Path, names: list[str]) -> list[str]:
        """Graph outputs in the ONNX file's order and spelling (the baseline's names)."""
        import onnx

        try:
            m = onnx.load(str(model_path), load_external_data=False)
        except Exception:
            return names
        onnx_outs = [o.name for o in m.graph.output]
        return [n for n in onnx_outs if n in set(names)] + [n for n in names if n not in set(onnx_outs)]

    def observer(self, model_path: Path, config: EngineConfig, optimized_path: Optional[str]):
        if not optimized_path or not Path(optimized_path).exists():
            return None
        try:
            layers = json.loads(Path(optimized_path).read_text(encoding="utf-8"))["layers"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return OvObserver(model_path, config, layers)

    def describe(self, config: EngineConfig) -> list[tuple[str, str]]:
        rows = [("engine", f"OpenVINO {self.device(config)}, INFERENCE_PRECISION_HINT "
                           f"{_HINTS.get(config.precision, config.precision)}"),
                ("compile properties", ", ".join(f"{k}={v}" for k, v in config.config_entries) or "(none)")]
        if marked_option(config):
            rows.append(("marked tensors", ", ".join(marked_option(config))))
        return rows

    def workaround_text(self, workaround) -> str:
        kind = workaround.get("kind")
        if kind == "mark_outputs":
            names = workaround.get("marked_tensors") or []
            return ("model.add_outputs(%s) before core.compile_model(...): the marked tensor blocks the fusion "
                    "(bisect-tui: --ov-mark %s)" % (json.dumps(names), " --ov-mark ".join(names)))
        if kind == "precision":
            return "core.compile_model(model, 'CPU', {'INFERENCE_PRECISION_HINT': '%s'})" % _HINTS.get(
                workaround.get("precision", "fp32"), "f32")
        return ("OpenVINO offers no switch for this fusion here (release builds have no per-pass switch and "
                "marking did not block it); rewrite the graph to break the pattern, or report it upstream")

    def write_repro(self, dest: Path, spec: ReproSpec) -> list[Path]:
        """repro.py (constant text) + repro.json (every name and setting, as data)."""
        from bisect_tui.engines.openvino.repro import write_repro

        return write_repro(dest, spec)

    def known_passes(self) -> set[str]:
        return set()  # no per-pass switch in release builds

    def unknown_passes(self, names: Iterable[str]) -> list[str]:
        return list(names)

    def versions(self) -> dict[str, str]:
        import onnx

        openvino = import_openvino()
        return {"openvino": openvino.__version__.split("-")[0], "openvino_build": openvino.__version__,
                "onnx": onnx.__version__, "numpy": np.__version__}


__all__ = ["OpenVinoEngine", "OvBuilt", "OvObserver", "fused_node_map", "runtime_layers"]
