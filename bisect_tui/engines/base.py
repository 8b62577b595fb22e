"""The engine interface every backend implements.

An engine builds the *fused* program from the prepared ONNX model with a
precision/optimization config and a set of **marked** tensors (tensors that
must stay observable: the engine may not fuse across them), runs it, and says
which original ONNX nodes each node of its optimized program covers. The
bisection only ever talks to this interface, so TensorRT, OpenVINO or an
external dump plug in without touching the search.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Collection, Optional, Protocol

import numpy as np

LEVELS = ("disable", "basic", "extended", "all")
PRECISIONS = ("fp32", "fp16")


@dataclass(frozen=True)
class EngineConfig:
    """What the user asked the fused engine to be. Hashable and JSON-able."""

    level: str = "all"
    precision: str = "fp32"
    # session config entries, e.g. ("optimization.enable_gelu_approximation", "1")
    config_entries: tuple[tuple[str, str], ...] = ()
    disabled_optimizers: tuple[str, ...] = ()
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    # original node names kept in FP32 when precision is reduced (the keep-set);
    # the ORT engine passes them to the FP16 converter's node block list
    keep_fp32: tuple[str, ...] = ()

    def with_disabled(self, names: Collection[str]) -> "EngineConfig":
        merged = tuple(sorted(set(self.disabled_optimizers) | set(names)))
        return EngineConfig(
            self.level, self.precision, self.config_entries, merged, self.providers, self.keep_fp32
        )

    def with_level(self, level: str) -> "EngineConfig":
        return EngineConfig(
            level, self.precision, self.config_entries, self.disabled_optimizers, self.providers,
            self.keep_fp32,
        )

    def with_keep_fp32(self, names: Collection[str]) -> "EngineConfig":
        return EngineConfig(
            self.level, self.precision, self.config_entries, self.disabled_optimizers, self.providers,
            tuple(sorted(set(names))),
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config_entries"] = {k: v for k, v in self.config_entries}
        if not self.keep_fp32:  # absent when empty: keys of existing sessions stay valid
            d.pop("keep_fp32")
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
            disabled_optimizers=tuple(d.get("disabled_optimizers") or ()),
            providers=tuple(d.get("providers") or ("CPUExecutionProvider",)),
            keep_fp32=tuple(d.get("keep_fp32") or ()),
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
        d = asdict(self)
        d["is_fused"] = self.is_fused
        return d

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


class BuiltEngine(Protocol):
    """A built (fused) program ready to run."""

    config: EngineConfig
    output_names: list[str]  # graph outputs first, then marked tensors
    fused_nodes: list[FusedNode]
    optimized_model_path: Optional[Path]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class Engine(Protocol):
    name: str

    def build(
        self,
        model_path: Path,
        config: EngineConfig,
        marked: Collection[str] = (),
        workdir: Optional[Path] = None,
    ) -> BuiltEngine: ...

    def known_optimizers(self) -> set[str]:
        """Optimizer names the installed engine knows (learnt, not hard-coded)."""
        ...

    def unknown_optimizers(self, names: Collection[str]) -> list[str]:
        """The names in `names` the installed engine does not know."""
        ...

    def versions(self) -> dict[str, str]: ...
