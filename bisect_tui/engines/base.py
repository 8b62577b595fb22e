"""The engine interface every backend implements.

An engine builds the *fused* program from the prepared ONNX model with a
precision/optimization config and a `Switch` (what the search varies: tensors
to mark, nodes to keep in high precision, passes to disable), runs it, and says
which original ONNX nodes each node of its optimized program covers. The
bisection only ever talks to this interface, so ONNX Runtime, OpenVINO,
TensorRT or an external dump plug in without touching the search.

What each engine declares (class attributes, readable without importing the
engine's library, so `--help` and the settings form stay fast):

* `options`: the engine's own settings (`EngineOption`), which drive the CLI
  flags, the app's settings form, validation with "did you mean", the report's
  settings lines and the session key;
* `capabilities`: which parts of a `Switch` it honours and whether marking
  really switches its fusions off (`Capabilities`).

What each engine does (methods): `build`, `validate`, `describe`,
`workaround_text`, `write_repro`, `versions`; a built engine runs, observes
tensors without blocking fusion where it can (`observe`), and says which fused
nodes survived the marking (`fusions_across`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Mapping, Optional, Protocol, Sequence

if TYPE_CHECKING:  # numpy only in annotations: the declarations stay cheap to import
    import numpy as np

# the engine errors live with the exit codes; re-exported so engines import one module
from bisect_tui.core.errors import EngineBuildError, EngineRunError  # noqa: F401

LEVELS = ("disable", "basic", "extended", "all")
# every precision some engine runs; each engine lists its own in `Capabilities.precisions`
PRECISIONS = ("fp32", "fp16", "bf16")


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class EngineOption:
    """One setting an engine declares (harlequin-style adapter options).

    `field` says where the value lives in `EngineConfig`: one of its fields
    (`level`, `config_entries`, `disabled_optimizers`, `providers`) or
    `options.<name>` for an engine-specific value kept in `EngineConfig.options`.
    `kind`: "choice" (one of `choices`), "text", "list" (repeatable, e.g. pass
    names), "mapping" (repeatable KEY=VALUE). `flag` is the CLI flag."""

    name: str
    kind: str
    default: Any
    help: str
    flag: str
    field: str
    choices: tuple[str, ...] = ()
    metavar: Optional[str] = None
    label: str = ""  # the settings form's label; `name` when empty
    form_id: str = ""  # the settings form's widget id; `opt-<name>` when empty
    placeholder: str = ""  # the settings form's hint in an empty field
    in_form: bool = True  # False: CLI only (e.g. providers, which depend on the machine)

    @property
    def widget_id(self) -> str:
        return self.form_id or f"opt-{self.name}"

    def config_value(self, config: "EngineConfig") -> Any:
        if self.field.startswith("options."):
            return dict(config.options).get(self.field[len("options."):], self.default)
        return getattr(config, self.field)


@dataclass(frozen=True)
class Capabilities:
    """Which switches an engine honours, in the words of the capability table
    (docs/engines.md)."""

    marking: bool  # tensors can be made observable (extra outputs, debug tensors)
    # marking a tensor always stops the engine fusing across it (ORT). False when
    # the engine may keep a fusion behind a marked tensor (OpenVINO's MVN): then
    # each build says which fusions survived (`BuiltEngine.fusions_across`) and
    # the search judges such regions in isolation.
    marking_blocks: bool
    pass_switches: bool  # named passes can be disabled (ORT disabled_optimizers)
    keep_high_precision: bool  # original nodes can be pinned to FP32 (a keep-set)
    levels: tuple[str, ...] = ("all",)  # optimization levels, lowest first
    precisions: tuple[str, ...] = ("fp32",)
    observation: str = ""  # how `observe` sees fused tensors, one line
    # op domains of nodes a layout rewrite makes (ORT's NCHWc at level "all"): such
    # a node stands for a whole trunk, so a culprit found there is searched again
    # at the lowest failing level, whose map is finer
    coarse_domains: tuple[str, ...] = ()
    # a build may run in a thread beside other work of this process: the library
    # lets go of the GIL while it builds (ORT's session creation: two at once in
    # two threads took 0.69 s against 1.17 s one after the other on a 5,000-node
    # model), and the engine object holds no per-build state
    concurrent_builds: bool = False


@dataclass(frozen=True)
class Switch:
    """What the search varies between builds, as one object. Engines ignore
    nothing silently: a part their capabilities lack raises `ValueError`."""

    marks: tuple[str, ...] = ()
    keep_high_precision: tuple[str, ...] = ()
    disabled_passes: tuple[str, ...] = ()

    def check(self, caps: Capabilities) -> None:
        if self.marks and not caps.marking:
            raise ValueError("this engine cannot mark tensors")
        if self.disabled_passes and not caps.pass_switches:
            raise ValueError("this engine has no pass switches")
        if self.keep_high_precision and not caps.keep_high_precision:
            raise ValueError("this engine cannot keep nodes in high precision")

    def apply(self, config: "EngineConfig") -> "EngineConfig":
        """The config a build with this switch uses (marks travel separately)."""
        cfg = config
        if self.disabled_passes:
            cfg = cfg.with_disabled(self.disabled_passes)
        if self.keep_high_precision:
            cfg = cfg.with_keep_fp32(set(cfg.keep_fp32) | set(self.keep_high_precision))
        return cfg


@dataclass(frozen=True)
class EngineConfig:
    """What the user asked the fused engine to be. Hashable and JSON-able."""

    level: str = "all"
    precision: str = "fp32"
    # session config entries, e.g. ("optimization.enable_gelu_approximation", "1")
    config_entries: tuple[tuple[str, str], ...] = ()
    disabled_passes: tuple[str, ...] = ()
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    # original node names kept in FP32 when precision is reduced (the keep-set);
    # the ORT engine passes them to the FP16 converter's node block list
    keep_fp32: tuple[str, ...] = ()
    # engine-specific values declared as `options.<name>` (sorted pairs)
    options: tuple[tuple[str, str], ...] = ()

    def with_disabled(self, names: Collection[str]) -> "EngineConfig":
        merged = tuple(sorted(set(self.disabled_passes) | set(names)))
        return dataclasses.replace(self, disabled_passes=merged)

    def with_level(self, level: str) -> "EngineConfig":
        return dataclasses.replace(self, level=level)

    def with_keep_fp32(self, names: Collection[str]) -> "EngineConfig":
        return dataclasses.replace(self, keep_fp32=tuple(sorted(set(names))))

    def with_precision(self, precision: str) -> "EngineConfig":
        return dataclasses.replace(self, precision=precision, keep_fp32=())

    def with_options(self, **values: str) -> "EngineConfig":
        merged = {**dict(self.options), **{k: str(v) for k, v in values.items()}}
        return dataclasses.replace(self, options=tuple(sorted(merged.items())))

    def option(self, name: str, default: Optional[str] = None) -> Optional[str]:
        return dict(self.options).get(name, default)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config_entries"] = {k: v for k, v in self.config_entries}
        if not self.keep_fp32:  # absent when empty: keys of existing sessions stay valid
            d.pop("keep_fp32")
        if self.options:
            d["options"] = {k: v for k, v in self.options}
        else:
            d.pop("options")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "EngineConfig":
        ce = d.get("config_entries") or {}
        if isinstance(ce, dict):
            ce = tuple(sorted(ce.items()))
        return cls(
            level=d.get("level", "all"),
            precision=d.get("precision", "fp32"),
            config_entries=tuple(tuple(x) for x in ce),
            disabled_passes=tuple(d.get("disabled_optimizers") or ()),
            providers=tuple(d.get("providers") or ("CPUExecutionProvider",)),
            keep_fp32=tuple(d.get("keep_fp32") or ()),
            options=tuple(sorted((str(k), str(v)) for k, v in (d.get("options") or {}).items())),
        )

    def key(self) -> str:
        """Stable short hash, used to cache builds in the session directory."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:12]


@dataclass
class FusedNode:
    """One node of the engine's optimized program, mapped back to the original graph."""

    name: str
    op_type: str
    domain: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    # names of the prepared model's nodes this node replaced, topological order
    original_nodes: list[str] = field(default_factory=list)
    # optimizer names read from the node name tags (e.g. "LayerNormFusion")
    optimizers: list[str] = field(default_factory=list)

    @property
    def is_fused(self) -> bool:
        """True when this node is not simply one original node left as it was."""
        if len(self.original_nodes) > 1:
            return True
        return bool(self.optimizers)

    def to_dict(self) -> dict:
        # by hand, not dataclasses.asdict: maps of thousands of nodes are written per build
        return {"name": self.name, "op_type": self.op_type, "domain": self.domain,
                "inputs": list(self.inputs), "outputs": list(self.outputs),
                "original_nodes": list(self.original_nodes), "optimizers": list(self.optimizers),
                "is_fused": self.is_fused}

    @classmethod
    def from_dict(cls, d: dict) -> "FusedNode":
        return cls(
            name=d["name"],
            op_type=d["op_type"],
            domain=d.get("domain", ""),
            inputs=list(d.get("inputs", [])),
            outputs=list(d.get("outputs", [])),
            original_nodes=list(d.get("original_nodes", [])),
            optimizers=list(d.get("optimizers", [])),
        )


@dataclass(frozen=True)
class ReproSpec:
    """What an engine's repro script needs, all data (names are never code:
    the script text is constant and reads them from `repro.json`)."""

    model_file: str  # relative to the bundle
    inputs_file: str  # .npz, relative to the bundle
    config: dict  # EngineConfig.to_dict()
    outputs: list[str]
    tolerance: dict  # per output: {"atol": ..., "rtol": ..., "min_cosine": ...}
    reference: dict  # {"file": .npz, "name": what computed it}
    workaround: Optional[dict] = None  # the proven workaround, engine-shaped
    extra: dict = field(default_factory=dict)


class BuiltEngine(Protocol):
    """A built (fused) program ready to run."""

    config: EngineConfig
    output_names: list[str]  # graph outputs first, then marked tensors
    fused_nodes: list[FusedNode]
    # a file that shows the optimized program (ORT: the saved optimized ONNX;
    # OpenVINO: the runtime graph as JSON); None when the engine has none
    optimized_model_path: Optional[Path]
    # marked tensors the engine could not mark (renamed by a conversion)
    unmarkable: list[str]

    def run(self, feeds: dict[str, np.ndarray], names: Optional[Sequence[str]] = None) -> dict[str, np.ndarray]:
        """Outputs by name: all (graph outputs, then marked tensors), or only
        `names` (a search step judges the graph outputs only: copying out
        thousands of marked activations per build is wasted time and memory)."""
        ...

    def observe(self, feeds: dict[str, np.ndarray], tensors: Sequence[str]) -> dict[str, np.ndarray]:
        """Values of original tensors as the fused program computes them, without
        blocking the fusions that produce them where the engine allows (ORT: its
        saved optimized graph rerun unoptimized). Tensors it cannot see are absent."""
        ...

    def fusions_across(self, marks: Collection[str]) -> list[FusedNode]:
        """Fused nodes of this build that still hide a marked tensor inside
        (marking did not block them). Always [] for an engine whose marking blocks."""
        ...

    def precision_used(self) -> str:
        """The precision the compiled program really runs (read back from the
        engine, not the one asked for)."""
        ...

    def close(self) -> None: ...


class Observer(Protocol):
    """What the fused-graph probe reads after the search: the fused program's
    own tensors, seen without undoing a fusion."""

    tensors: list[str]  # original tensor names the fused program exposes

    def observe(self, feeds: dict[str, np.ndarray], tensors: Sequence[str]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class Engine(Protocol):
    name: str  # registry key, e.g. "ort"
    label: str  # user words, e.g. "ONNX Runtime"
    library: str  # the distribution whose version matters, e.g. "onnxruntime"
    options: tuple[EngineOption, ...]
    capabilities: Capabilities

    def build(
        self,
        model_path: Path,
        config: EngineConfig,
        marked: Collection[str] = (),
        workdir: Optional[Path] = None,
    ) -> BuiltEngine: ...

    def validate(self, config: EngineConfig) -> None:
        """Raise `UserError` (one line, with "did you mean") for a value the
        installed engine would ignore or reject."""
        ...

    def describe(self, config: EngineConfig) -> list[tuple[str, str]]:
        """The report's settings lines: (label, value) pairs."""
        ...

    def observer(self, model_path: Path, config: EngineConfig,
                 optimized_path: Optional[str]) -> Optional[Observer]:
        """The probe's view of the unmarked engine `config` (its saved optimized
        program at `optimized_path` when it has one); None when it cannot observe."""
        ...

    def workaround_text(self, workaround: Mapping) -> str:
        """One line saying how to apply a proven workaround with this engine."""
        ...

    def write_repro(self, dest: Path, spec: ReproSpec) -> list[Path]:
        """Write a constant repro script (needs only numpy and this engine) plus
        its JSON into `dest`; returns the files written."""
        ...

    # Optional, looked up with getattr:
    #   default_precision() -> Optional[str]: what the engine picks when no precision is asked
    #   add_keepset_repro(bundle, triage, result, version): the keep-set repro (engines with a keep-set)

    def known_passes(self) -> set[str]:
        """Optimizer names the installed engine knows (learnt, not hard-coded)."""
        ...

    def unknown_passes(self, names: Collection[str]) -> list[str]:
        """The names in `names` the installed engine does not know."""
        ...

    def versions(self) -> dict[str, str]: ...


def did_you_mean(word: str, known: Collection[str]) -> str:
    """The tail every validation message shares: "; did you mean X, Y?" or nothing."""
    import difflib

    hints = difflib.get_close_matches(word, sorted(known), n=3)
    return f"; did you mean {', '.join(hints)}?" if hints else ""
