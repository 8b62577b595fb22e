"""The engine interface every backend implements.

An engine builds the *fused* program from the prepared ONNX model with a
precision/optimization config and the marks the search asks for, runs it, and
says which original ONNX nodes each node of its optimized program covers. The
search only ever talks to this interface.

What each engine declares (class attributes, readable without importing the
engine's library, so `--help` and the settings form stay fast): `options`
(`EngineOption`) and `capabilities` (`Capabilities`).

`Engine` is the protocol the core relies on; `EngineBase` is the class engines
derive from: it gives every optional hook a default, so the core calls hooks
instead of probing for them, and a new engine writes only what it has.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Optional, Protocol, Sequence

from bisect_tui.api.capabilities import Capabilities
from bisect_tui.api.config import EngineConfig
from bisect_tui.api.graph import FusedNode
from bisect_tui.api.options import EngineOption

if TYPE_CHECKING:  # numpy only in annotations: the contract stays cheap to import
    import numpy as np

    from bisect_tui.api.repro import ReproSpec  # a repro is written only for a bundle


@dataclass(frozen=True, eq=False)
class BuildContext:
    """What a build may need besides the model and config, handed in rather than
    dug out of the session directory: the shapes the triage runs, its input
    feeds (or the .npz holding them), a directory for caches that outlive one
    build, a progress callback (text -> False to stop), a cancel check
    (raises `Cancelled` once the user asked to stop) and `entered`, which an
    engine whose builds let go of the GIL (Capabilities.concurrent_builds) calls
    once, from the building thread, as its library takes over: the caller's next
    work may hold the interpreter for long (shape inference of a whole graph held it
    0.43 s at 21,000 nodes while the build had not yet reached the library)."""

    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    feeds: Optional[Mapping[str, Any]] = None
    feeds_file: Optional[Path] = None
    cache_dir: Optional[Path] = None
    progress: Optional[Callable[[str], bool]] = None
    cancel_check: Optional[Callable[[], None]] = None
    entered: Optional[Callable[[], None]] = None
    # False: the caller reads the outputs only (a part of a marked build made in parts),
    # never the map or the optimized program, so the engine need not write it
    map_wanted: bool = True
    # the ONNX model at the path given, as the caller made it in memory (a part of a
    # parted build; not to be changed): an engine may build from it instead of reading
    # the file back, which stays there for engines that read files
    model: Any = None


class BuiltEngine(Protocol):
    """A built (fused) program ready to run."""

    config: EngineConfig
    output_names: list[str]  # graph outputs first, then marked tensors
    fused_nodes: list[FusedNode]
    # a file that shows the optimized program (a saved optimized ONNX, a runtime
    # graph as JSON); None when the engine has none
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
        blocking the fusions that produce them where the engine allows.
        Tensors it cannot see are absent."""
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
    # optional: {exposed name: original name} for tensors a conversion renamed (an
    # FP16 engine's FP32 copies); the probe reads it with getattr

    def observe(self, feeds: dict[str, np.ndarray], tensors: Sequence[str]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class Engine(Protocol):
    name: str  # registry key, e.g. "ort"
    label: str  # user words, e.g. "ONNX Runtime"
    library: str  # the distribution whose version matters
    options: tuple[EngineOption, ...]
    capabilities: Capabilities

    def build(self, model_path: Path, config: EngineConfig, marked: Collection[str] = (),
              workdir: Optional[Path] = None, *, context: Optional[BuildContext] = None) -> BuiltEngine: ...

    def validate(self, config: EngineConfig) -> None: ...

    def describe(self, config: EngineConfig) -> list[tuple[str, str]]: ...

    def observer(self, model_path: Path, config: EngineConfig,
                 optimized_path: Optional[str]) -> Optional[Observer]: ...

    def workaround_text(self, workaround: Mapping) -> str: ...

    def write_repro(self, dest: Path, spec: ReproSpec) -> list[Path]: ...

    def versions(self) -> dict[str, str]: ...

    def known_passes(self) -> set[str]: ...

    def builds_in_parts(self, config: EngineConfig) -> bool: ...

    def unknown_passes(self, names: Collection[str]) -> list[str]: ...


class EngineBase:
    """Defaults for everything an engine may leave out. `build` is the one
    method without a default; the rest says "this engine has none of it"."""

    name: str = ""
    label: str = ""
    library: str = ""
    options: tuple[EngineOption, ...] = ()
    capabilities: Capabilities = Capabilities(marking=False, marking_blocks=True, pass_switches=False,
                                              keep_high_precision=False)
    # builder phases of an engine whose builds take minutes (text -> False stops
    # the build); whoever drives the engine sets it when it is None
    progress: Optional[Callable[[str], bool]] = None

    def build(self, model_path: Path, config: EngineConfig, marked: Collection[str] = (),
              workdir: Optional[Path] = None, *, context: Optional[BuildContext] = None) -> BuiltEngine:
        raise NotImplementedError(f"{type(self).__name__}.build")

    def validate(self, config: EngineConfig) -> None:
        """Raise `UserError` (one line, with "did you mean") for a value the
        installed engine would ignore or reject; by default the declared
        levels and precisions."""
        from bisect_tui.api.errors import UserError

        problem = self.capabilities.problem(config.level, config.precision)
        if problem:
            raise UserError(f"{self.label or self.name}: {problem}")

    def describe(self, config: EngineConfig) -> list[tuple[str, str]]:
        """The report's settings lines: (label, value) pairs."""
        return [("engine", f"{self.label or self.name}, {config.precision.upper()}")]

    def observer(self, model_path: Path, config: EngineConfig, optimized_path: Optional[str]):
        """The probe's view of the unmarked engine `config`; None: it cannot observe."""
        return None

    def workaround_text(self, workaround: Mapping) -> str:
        """One line saying how to apply a proven workaround with this engine."""
        if workaround.get("kind") == "mark_outputs":
            return ("add these tensors to the model's outputs to block the fusion: "
                    + ", ".join(workaround.get("marked_tensors") or []))
        return "no switch of this engine restored tolerance; see the steps"

    def write_repro(self, dest: Path, spec: ReproSpec) -> list[Path]:
        """A constant repro script plus its JSON in `dest`; by default the JSON
        only (what a script of this engine would read)."""
        path = Path(dest) / "repro.json"
        path.write_text(json.dumps({"config": spec.config, "outputs": list(spec.outputs),
                                    "tolerance": spec.tolerance, "reference": spec.reference,
                                    "workaround": spec.workaround}, indent=2), encoding="utf-8")
        return [path]

    def add_keepset_repro(self, bundle: Path, triage, result: dict, version: str) -> None:
        """Append the keep-set repro to the bundle zip (engines with a keep-set)."""

    def versions(self) -> dict[str, str]:
        return {}

    def default_precision(self) -> Optional[str]:
        """What the engine picks when no precision is asked; None: what was asked."""
        return None

    def warm_up(self, model_path: Optional[Path] = None) -> None:
        """Once per process before the first build (a worker, while the parent
        is busy): imports, and given the model, what every build re-reads."""

    def know_original(self, model_path: Path, model, index) -> None:
        """The prepared model just written to `model_path` (and its graph index),
        for engines that map builds back to it."""

    def builds_in_parts(self, config: EngineConfig) -> bool:
        """Whether a graph whose every tensor is marked, built as parts one after the
        other (each part's inputs fed from the part before), is the same program as
        that graph built whole (core/bisect/parts.py): no cross-node rewrite, no
        whole-graph conversion, no device placement that a cut changes. No by default."""
        return False

    def known_passes(self) -> set[str]:
        """Pass names the installed engine knows (learnt, not hard-coded)."""
        return set()

    def unknown_passes(self, names: Collection[str]) -> list[str]:
        """The names in `names` the installed engine does not know."""
        known = self.known_passes()
        return [n for n in names if n not in known]

    def pass_candidates(self, tags: Sequence[str], known: Collection[str]) -> list[str]:
        """Pass names worth confirming for a fused node tagged `tags` (what the
        engine wrote on it), as names the engine accepts for disabling."""
        return list(dict.fromkeys(tags))

    def modifying_passes(self, model_path: Path, config: EngineConfig) -> Optional[list[str]]:
        """The passes the engine's own log says changed this model; None: no log."""
        return None

    def pass_plan(self, model_path: Path, config: EngineConfig) -> Optional[dict]:
        """The passes the pass bisection may switch off for `config` (the fallback
        when no fused node can be blamed): {"passes": names the engine accepts for
        disabling, in the order it runs them, "groups": {container: [member
        names]} for a pass that is a group of smaller ones, "ran": those its log
        shows ran on this model, "source": where the list came from}. Learnt from
        the installed engine, never a hand list; None: this engine cannot list them."""
        return None

    def pass_log_note(self, found: str, logged: Sequence[str]) -> Optional[str]:
        """Why `found` may be missing from the engine's log of `logged` passes."""
        return None

    def named_tensors(self, config: EngineConfig) -> list[tuple[str, list[str]]]:
        """(flag, tensor names) the user gave in this engine's options (those
        declared `names="tensor"`), for the core to check against the model."""
        import json

        out = []
        for opt in self.options:
            if opt.names != "tensor":
                continue
            value = opt.config_value(config)
            if isinstance(value, str):
                try:
                    value = json.loads(value) if value.startswith("[") else [value]
                except ValueError:
                    value = [value]
            names = [str(v) for v in (value or ())]
            if names:
                out.append((opt.flag, names))
        return out

    def normalize_option(self, option: EngineOption, value: Any) -> Any:
        """A raw option value as the engine keeps it (e.g. short names spelt out);
        called for options declared with `normalized=True`."""
        return value
