"""ONNX Runtime as the fused engine: the contract's methods, over the session
builder (session.py), the pass names (passes.py), ORT's own log of them
(passlog.py) and the repro scripts (repro.py).

Facts it relies on (checked in the project notes on ORT), besides session.py's:

* Fused nodes keep the output tensor names of the last original node they
  replace, so the fused-node map is computed from *tensor* names
  (`fused_node_map`), never from node names.
* ORT silently ignores optimizer names it does not know, and the names changed
  between releases. `known_optimizers` learns the names from the installed
  native library (a superset check) and `confirm_optimizer_effect` proves that
  disabling a name really changes the optimized graph.

onnxruntime is imported inside functions so that importing this module (and
`bisect-tui --help`) stays fast. Every API used exists in onnxruntime 1.16.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Collection, Iterable, Optional

from bisect_tui.api import BuildContext, EngineBase, EngineConfig, UserError, did_you_mean
from bisect_tui.engines.ort.declare import CAPABILITIES, CPU_PROVIDER, LABEL, OPTIONS, PROVIDER_NAMES, providers_of
from bisect_tui.engines.ort.fusedmap import fused_node_map  # noqa: F401  (importable from the package)
from bisect_tui.engines.ort.levels import LEVEL_NAMES
from bisect_tui.engines.ort.passes import (  # noqa: F401
    known_config_keys,
    known_optimizers,
    optimizer_tags,
    pass_candidates,
    pass_log_note,
    unknown_config_keys,
    unknown_optimizers,
    versions,
)
from bisect_tui.engines.ort.observer import OrtObserver
from bisect_tui.engines.ort.session import (  # noqa: F401
    OrtBuilt,
    know_original,
    marking_base,
    validate_basics,
)
from bisect_tui.engines.ort.session import build as build_session

if TYPE_CHECKING:
    from bisect_tui.api import ReproSpec  # annotations only: a repro is written for a bundle


class OrtEngine(EngineBase):
    """ONNX Runtime engine (see module docstring for the facts it relies on)."""

    name = "ort"
    label = LABEL
    library = "onnxruntime"
    options = OPTIONS
    capabilities = CAPABILITIES

    def know_original(self, model_path: Path, model, index) -> None:
        """The checklist's own copy and index of the prepared model it has just written."""
        know_original(model_path, model, index)

    def warm_up(self, model_path: Optional[Path] = None) -> None:
        """What a build worker does before its first job, while the parent is
        still busy with the baseline: load the native library and the names
        scanned from it (the fused-node map needs them); given the model, read
        it once, with its tensor names and types, for the marked builds."""
        import onnxruntime

        from bisect_tui.engines.ort.unfused import quiet_ort

        quiet_ort()
        onnxruntime.get_available_providers()
        known_optimizers()
        if model_path is not None:
            marking_base(Path(model_path))

    def validate(self, config: EngineConfig) -> None:
        """Every value checked against the installed ORT, which would ignore a
        misspelt optimizer or config key and silently fall back to CPU for a
        missing provider."""
        validate_basics(config)
        bad = unknown_optimizers(config.disabled_passes)
        if bad:
            import onnxruntime

            raise UserError(
                f"--disable {bad[0]}: the installed engine (ort {onnxruntime.__version__}) does not know this "
                "optimizer and would silently ignore it" + did_you_mean(bad[0], known_optimizers()))
        keys = unknown_config_keys(k for k, _ in config.config_entries)
        if keys:
            import onnxruntime

            raise UserError(
                f"--ort-config {keys[0]}: onnxruntime {onnxruntime.__version__} does not know this session "
                "config key and would silently ignore it" + did_you_mean(keys[0], known_config_keys()))

    def normalize_option(self, option, value):
        return self.providers_for(value) if option.name == "provider" else value

    @staticmethod
    def providers_for(names) -> tuple[str, ...]:
        """`--ort-provider cuda` -> (CUDAExecutionProvider, CPUExecutionProvider): the CPU
        provider stays last as the fallback for ops the chosen one lacks."""
        chosen = []
        for n in names:
            full = PROVIDER_NAMES.get(str(n).lower(), str(n))
            if full not in chosen:
                chosen.append(full)
        if CPU_PROVIDER not in chosen:
            chosen.append(CPU_PROVIDER)
        return tuple(chosen)

    @staticmethod
    def available_providers() -> list[str]:
        import onnxruntime

        return list(onnxruntime.get_available_providers())

    def describe(self, config: EngineConfig) -> list[tuple[str, str]]:
        return [
            ("engine", f"ONNX Runtime, {LEVEL_NAMES.get(config.level, config.level)}, "
                       f"{config.precision.upper()}, {', '.join(providers_of(config))}"),
            ("session config", ", ".join(f"{k}={v}" for k, v in config.config_entries) or "(none)"),
            ("disabled optimizers", ", ".join(config.disabled_passes) or "(none)"),
        ] + ([("kept in FP32", ", ".join(config.keep_fp32))] if config.keep_fp32 else [])

    def workaround_text(self, workaround) -> str:
        kind = workaround.get("kind")
        if kind == "disable_optimizers":
            return ("SessionOptions: InferenceSession(..., disabled_optimizers=[%s])"
                    % ", ".join(repr(n) for n in workaround.get("disabled_optimizers") or []))
        if kind == "mark_outputs":
            return ("add these tensors to the model's outputs to block the fusion: "
                    + ", ".join(workaround.get("marked_tensors") or []))
        if kind == "keep_fp32":
            # ORT's converter alone still rounds what it blocks (issue 21): fp16.convert repairs its casts
            if workaround.get("keep_fp32"):
                return ("convert_float_to_float16(model, keep_io_types=True, node_block_list=%r) with its FP16 "
                        "round trips on the kept nodes removed: bisect_tui.engines.ort.fp16.convert(model, keep) "
                        "(keepset/fp16_convert.py in the bundle)" % (list(workaround["keep_fp32"]),))
            return ("onnxruntime.transformers.float16.convert_float_to_float16(node_block_list=...), casts repaired "
                    "by bisect_tui.engines.ort.fp16.convert")
        return "no optimizer switch or marking restored tolerance; see the steps"

    def observer(self, model_path: Path, config: EngineConfig, optimized_path: Optional[str]):
        """What the fused-graph probe reads (None when no optimized graph was saved)."""
        if not optimized_path or not Path(optimized_path).exists():
            return None
        return OrtObserver(Path(optimized_path), in_parts=self.builds_in_parts(config))

    def write_repro(self, dest: Path, spec: ReproSpec) -> list[Path]:
        from bisect_tui.engines.ort.repro import write_ort_repro

        return write_ort_repro(dest, spec)

    def add_keepset_repro(self, bundle: Path, triage, result: dict, version: str) -> None:
        """The FP16 keep-set repro (`keepset/` in the bundle): numpy, onnx and onnxruntime only."""
        from bisect_tui.engines.ort.repro import add_keepset_repro

        add_keepset_repro(bundle, triage, result, version)

    def build(self, model_path: Path, config: EngineConfig, marked: Collection[str] = (),
              workdir: Optional[Path] = None, *, context: Optional[BuildContext] = None) -> OrtBuilt:
        """Build the fused session for `config` with `marked` tensors kept observable
        (session.build: unmarkable tensors listed, errors in one line, a temp dir
        owned by the result when no `workdir` is given). Of the context ORT reads
        `entered`, `map_wanted` and `model`."""
        return build_session(model_path, config, marked, workdir,
                             entered=context.entered if context is not None else None,
                             save_optimized=context is None or context.map_wanted,
                             given=context.model if context is not None else None)

    def builds_in_parts(self, config: EngineConfig) -> bool:
        """On the CPU provider in FP32: each node is a kernel of its own once every
        tensor is marked, and nothing is placed on a device or converted as a whole
        (the FP16 conversion and other providers' partitioning see the whole graph)."""
        return config.precision == "fp32" and providers_of(config) == (CPU_PROVIDER,)

    def known_passes(self) -> set[str]:
        return set(known_optimizers())

    def unknown_passes(self, names: Iterable[str]) -> list[str]:
        return unknown_optimizers(names)

    def versions(self) -> dict[str, str]:
        return versions()

    def pass_candidates(self, tags, known) -> list[str]:
        return pass_candidates(tags, known)

    def modifying_passes(self, model_path: Path, config: EngineConfig) -> Optional[list[str]]:
        from bisect_tui.engines.ort import passlog  # the optimizer log: only a bisection reads it

        return passlog.modifying_passes(model_path, config)

    def pass_plan(self, model_path: Path, config: EngineConfig) -> Optional[dict]:
        from bisect_tui.engines.ort import passlog  # the optimizer log: only a bisection reads it

        return passlog.pass_plan(model_path, config)

    def pass_log_note(self, found: str, logged) -> Optional[str]:
        return pass_log_note(found, logged)

    def confirm_optimizer_effect(self, model_path: Path, config: EngineConfig, optimizer_names: Iterable[str],
                                 workdir: Optional[Path] = None) -> dict[str, bool]:
        from bisect_tui.engines.ort import passlog  # the optimizer log: only a bisection reads it

        return passlog.confirm_optimizer_effect(self.build, model_path, config, optimizer_names, workdir)


def confirm_optimizer_effect(model_path: Path, config: EngineConfig, optimizer_names: Iterable[str],
                             workdir: Optional[Path] = None) -> dict[str, bool]:
    """Does disabling each name change ORT's optimized graph? (passlog.confirm_optimizer_effect)"""
    return OrtEngine().confirm_optimizer_effect(model_path, config, optimizer_names, workdir)


def modifying_passes(model_path: Path, config: EngineConfig) -> Optional[list[str]]:
    from bisect_tui.engines.ort import passlog  # the optimizer log: only a bisection reads it

    return passlog.modifying_passes(model_path, config)


__all__ = [
    "OrtBuilt",
    "OrtObserver",
    "known_config_keys",
    "unknown_config_keys",
    "OrtEngine",
    "confirm_optimizer_effect",
    "fused_node_map",
    "known_optimizers",
    "modifying_passes",
    "optimizer_tags",
    "unknown_optimizers",
    "versions",
]
