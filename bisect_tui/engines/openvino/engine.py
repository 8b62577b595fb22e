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
import tempfile
import weakref
from pathlib import Path
from typing import Collection, Iterable, Optional, Sequence

import numpy as np

from bisect_tui.core.bisect.repro_judge import with_judge
from bisect_tui.core.errors import EngineBuildError, EngineRunError, UserError
from bisect_tui.api import EngineConfig, FusedNode, ReproSpec, did_you_mean

from bisect_tui.engines.openvino import CAPABILITIES, OPTIONS, OV_PRECISIONS, _HINTS  # noqa: E402

_FROM_TYPE = {"f32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16", "f16": "fp16",
              "float16": "fp16"}
# runtime-graph layers that are plumbing, never a fused computation
_PLUMBING = frozenset({"Input", "Parameter", "Const", "Output", "Result", "Reorder"})


def _core():
    import openvino as ov

    core = getattr(_core, "_cached", None)
    if core is None:
        core = ov.Core()
        _core._cached = core
    return core


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("Check ", "Exception from")):
            return line[:300]
    return (text.splitlines()[0][:300] if text else type(e).__name__)


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


def precision_name(value) -> str:
    """OpenVINO's element type (Type, or its text) in the project's words."""
    text = getattr(value, "get_type_name", lambda: str(value))()
    text = str(text).strip().strip("<>").replace("Type:", "").strip().strip("'")
    return _FROM_TYPE.get(text, text)


# --------------------------------------------------------------------------- runtime graph


def runtime_layers(compiled) -> list[dict]:
    """The executed graph as plain records: name, layer type, original names,
    producer layers, runtime precision. JSON-able (kept next to each build)."""
    ops = compiled.get_runtime_model().get_ordered_ops()
    rows = []
    for op in ops:
        info = op.get_rt_info()

        def get(key: str) -> str:
            try:
                return str(info[key].astype(str))
            except Exception:
                return ""

        names = [n.strip() for n in get("originalLayersNames").split(",") if n.strip()]
        rows.append({
            "name": op.get_friendly_name(),
            "type": get("layerType"),
            "original": names,
            "inputs": [i.get_source_output().get_node().get_friendly_name() for i in op.inputs()],
            "precision": get("runtimePrecision"),
        })
    return rows


def fused_node_map(original, layers: list[dict], allow_shared: bool = False) -> list[FusedNode]:
    """Map each runtime layer to the original ONNX nodes it computes.

    Three sources, because `originalLayersNames` alone is incomplete:

    1. the names list (a node name, or a graph-output tensor name standing for
       its producer);
    2. tensors and topology: a layer computes everything between the tensors
       its producer layers hand it and the outputs of its named nodes, so the
       original graph is walked back from those outputs to that boundary (a
       normalization collapsed into one MVN names only its last node, but
       takes the normalization's input);
    3. for nodes still unowned, walking the original graph backwards: a node
       whose every consumer belongs to one layer is part of that layer.

    Nodes computed from constants only were folded at load and belong to no
    layer. With `allow_shared` a node may belong to several layers (a marked
    build can compute a node twice: once for the extra output, once inside a
    fusion), which is what `fusions_across` needs."""
    from bisect_tui.core.graph import GraphIndex

    idx = GraphIndex.build(original)
    by_name = idx.by_name
    constant = _folded_nodes(idx)
    graph_ins = set(idx.graph_inputs)
    graph_outs = set(idx.graph_outputs)
    owner: dict[str, int] = {}
    covered: list[list[str]] = []
    kept: list[dict] = []
    hands: dict[str, list[str]] = {}  # layer name -> original tensors it hands on
    for layer in layers:
        fed: list[str] = []
        for src in layer["inputs"]:
            for t in hands.get(src, []):
                if t not in fed:
                    fed.append(t)
        if layer["type"] in ("Input", "Parameter"):
            hands[layer["name"]] = [t for t in [layer["name"], *layer["original"]] if t in graph_ins][:1]
            continue
        if layer["type"] in _PLUMBING:
            hands[layer["name"]] = fed  # a reorder hands on what it was given
            continue
        named: list[str] = []
        for nm in layer["original"]:
            node = nm if nm in by_name else idx.producer.get(nm)
            if node and node not in named and node not in constant:
                named.append(node)
        if not named:
            hands[layer["name"]] = fed
            continue
        stop = set(fed) | idx.initializers | graph_ins
        nodes = list(named)
        todo = [t for n in named for t in by_name[n].input if t]
        while todo:
            t = todo.pop()
            if t in stop:
                continue
            stop.add(t)
            prod = idx.producer.get(t)
            if prod is None or prod in nodes or prod in constant:
                continue
            if not allow_shared and prod in owner:
                continue
            nodes.append(prod)
            todo.extend(i for i in by_name[prod].input if i)
        if not allow_shared:
            nodes = [n for n in nodes if n not in owner]
        k = len(kept)
        kept.append(layer)
        covered.append(nodes)
        for n in nodes:
            owner.setdefault(n, k)
        inside = set(nodes)
        hands[layer["name"]] = [t for n in nodes for t in by_name[n].output if t and (
            t in graph_outs or any(c not in inside for c in idx.consumers.get(t, [])))]
    for node in reversed(idx.nodes):
        name = node.name
        if name in owner or name in constant:
            continue
        if any(o in graph_outs for o in node.output if o):
            continue
        homes = {owner.get(c) for o in node.output if o for c in idx.consumers.get(o, [])}
        if len(homes) == 1 and None not in homes:
            k = homes.pop()
            owner[name] = k
            covered[k].append(name)
    out: list[FusedNode] = []
    for layer, nodes in zip(kept, covered):
        if not nodes:
            continue
        nodes = sorted(set(nodes), key=lambda n: idx.order.get(n, 0))
        inside = set(nodes)
        produced = [t for n in nodes for t in by_name[n].output if t]
        outs = [t for t in produced if t in graph_outs or any(c not in inside for c in idx.consumers.get(t, []))]
        ins: list[str] = []
        for n in nodes:
            for i in by_name[n].input:
                if i and i not in produced and i not in ins:
                    ins.append(i)
        out.append(FusedNode(name=layer["name"], op_type=layer["type"], domain="openvino",
                             inputs=ins, outputs=outs or produced[-1:], original_nodes=nodes))
    return out


def _folded_nodes(idx) -> set[str]:
    """Original nodes computed from constants only (OpenVINO folds them at load)."""
    const = set(idx.initializers)
    folded: set[str] = set()
    for node in idx.nodes:
        ins = [i for i in node.input if i]
        if node.op_type == "Constant" or (ins and all(i in const for i in ins)):
            folded.add(node.name)
            const.update(o for o in node.output if o)
    return folded


def interior_tensors(fn: FusedNode, original) -> set[str]:
    """Tensors a fused layer computes and consumes inside itself."""
    from bisect_tui.core.graph import GraphIndex

    idx = GraphIndex.build(original)
    inside = set(fn.original_nodes)
    return {t for n in fn.original_nodes for t in idx.by_name[n].output
            if t and all(c in inside for c in idx.consumers.get(t, [])) and t not in idx.graph_outputs}


# --------------------------------------------------------------------------- built


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
            result = self._request.infer({k: np.ascontiguousarray(v) for k, v in feeds.items()})
        except Exception as e:  # built, then failed on these inputs: a finding
            raise EngineRunError(f"OpenVINO failed to run the model: {_first_line(e)}", _first_line(e)) from None
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


class OpenVinoEngine:
    """OpenVINO engine (see the module docstring for the facts it relies on)."""

    name = "openvino"
    label = "OpenVINO"
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
        providers = [p for p in config.providers if p != "CPUExecutionProvider"]
        if providers:
            raise UserError("--ort-provider is an ONNX Runtime option; OpenVINO uses --ov-device")
        try:
            core = _core()
        except Exception as e:  # not installed, or a broken install
            raise UserError(f"OpenVINO is not available: {_first_line(e)}; pip install 'bisect-tui[openvino]'") \
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
              workdir: Optional[Path] = None) -> OvBuilt:
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
            raise EngineBuildError(f"OpenVINO could not read the model: {_first_line(e)}", _first_line(e)) from None
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
            raise EngineBuildError(f"OpenVINO could not compile the model: {_first_line(e)}", _first_line(e)) \
                from None
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
        """repro.py (constant text, below) + repro.json (every name and setting, as data)."""
        from bisect_tui.core import atomic

        dest = Path(dest)
        data = {
            "engine": "openvino",
            "model": spec.model_file,
            "inputs": spec.inputs_file,
            "expected": spec.reference.get("file"),
            "reference": spec.reference.get("name"),
            "outputs": list(spec.outputs),
            "device": spec.config.get("options", {}).get("device", "CPU"),
            "precision_hint": _HINTS.get(spec.config.get("precision", "fp32"), "f32"),
            "properties": dict(spec.config.get("config_entries") or {}),
            "tolerance": spec.tolerance,
            "workaround_marks": list((spec.workaround or {}).get("marked_tensors") or []),
        }
        atomic.write_json(dest / "repro.json", data)
        atomic.write_text(dest / "repro.py", OV_REPRO_SCRIPT)
        return [dest / "repro.py", dest / "repro.json"]

    def known_passes(self) -> set[str]:
        return set()  # no per-pass switch in release builds

    def unknown_passes(self, names: Iterable[str]) -> list[str]:
        return list(names)

    def versions(self) -> dict[str, str]:
        import openvino
        import onnx

        return {"openvino": openvino.__version__.split("-")[0], "openvino_build": openvino.__version__,
                "onnx": onnx.__version__, "numpy": np.__version__}


# The repro script: constant text, every model-derived name and value read from
# repro.json (names are data, never code).
OV_REPRO_SCRIPT = r'''#!/usr/bin/env python3
"""Repro: an OpenVINO fusion breaks tolerance (settings and names in repro.json).

Needs only numpy and openvino. Compiles the model with the settings in
repro.json, runs it on the exact tensors the FP32 baseline fed it and compares
with the unfused FP32 result.

    python repro.py                # exit 1 while the bug is present, 0 when fixed
    python repro.py --workaround   # with the proven marking (exit 0 when it works)
    python repro.py --mark TENSOR  # try marking another tensor
"""
import argparse
import json
import os
import sys

import numpy as np
import openvino as ov

HERE = os.path.dirname(os.path.abspath(__file__))


#@judge

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workaround", action="store_true", help="apply the proven marking from repro.json")
    ap.add_argument("--mark", action="append", default=[], metavar="TENSOR", help="add a tensor as an output")
    args = ap.parse_args()
    with open(os.path.join(HERE, "repro.json"), encoding="utf-8") as fh:
        spec = json.load(fh)
    marks = list(args.mark) + (list(spec["workaround_marks"]) if args.workaround else [])
    core = ov.Core()
    model = core.read_model(os.path.join(HERE, spec["model"]))
    if marks:
        model.add_outputs(marks)
    props = dict(spec["properties"])
    props["INFERENCE_PRECISION_HINT"] = spec["precision_hint"]
    try:
        compiled = core.compile_model(model, spec["device"], props)
    except Exception as exc:  # the engine does not even build: the bug is present
        print("OpenVINO failed to compile the model: %s" % str(exc).splitlines()[0])
        return 1
    used = compiled.get_property("INFERENCE_PRECISION_HINT")
    print("openvino %s, device %s, inference precision %s, marked %s"
          % (ov.__version__, spec["device"], used, marks or "none"))
    inputs = np.load(os.path.join(HERE, spec["inputs"]), allow_pickle=False)
    expected = np.load(os.path.join(HERE, spec["expected"]), allow_pickle=False)
    ports = {}
    for i, port in enumerate(compiled.outputs):
        for name in port.get_names():
            ports.setdefault(name, i)
    request = compiled.create_infer_request()
    broken = False
    samples = next(iter(inputs.values())).shape[0]
    for k in range(samples):
        values = list(request.infer({n: inputs[n][k] for n in inputs.files}).values())
        for name in spec["outputs"]:
            max_abs, fails = judge(expected[name][k], np.array(values[ports[name]]), spec["tolerance"])
            print("sample %d, output %r: max abs error vs %s %.3g -> %s %s"
                  % (k, name, spec["reference"], max_abs, "FAIL" if fails else "ok", "; ".join(fails)))
            broken |= bool(fails)
    print("bug present: the fused result breaks tolerance" if broken else "within tolerance")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
'''
OV_REPRO_SCRIPT = with_judge(OV_REPRO_SCRIPT)


__all__ = ["OpenVinoEngine", "OvBuilt", "OvObserver", "fused_node_map", "runtime_layers", "OV_REPRO_SCRIPT"]
